"""Decode-only stretches in one call: the scheduler's own steps, never when something could change them."""

from __future__ import annotations

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.decode_run import decode_steps
from pdfleet.sim.engine import Engine, EngineLimits, SimRequest
from tests.unit.sim.helpers import MODEL as MODEL_8B


def _engine(num_blocks: int) -> Engine:
    cfg = parse_serve_args([MODEL_8B], env={})
    return Engine(cfg.perf(), EngineLimits(num_blocks=num_blocks))


def _prefilled(eng: Engine, *outputs: int) -> float:
    """Requests of 100 tokens with these outputs, prefilled (each has its first token); the time after."""
    for i, out in enumerate(outputs):
        eng.add(SimRequest(f"r{i}", 100, out), 0.0)
    batch = eng.schedule(0.0)
    eng.complete(batch, batch.duration)
    return batch.duration


def test_decode_steps_runs_the_steps_the_scheduler_would_and_stops_before_a_finish() -> None:
    fast, slow = _engine(1000), _engine(1000)
    t0 = _prefilled(fast, 5, 9)
    _prefilled(slow, 5, 9)
    ends = decode_steps(fast, t0, float("inf"))
    assert len(ends) == 3  # r0 has 4 tokens to go: the 4th (its finish) is left to complete()
    t, expected = t0, []
    for _ in range(3):
        batch = slow.schedule(t)
        t += batch.duration
        slow.complete(batch, t)
        expected.append(t)
    assert ends == expected
    assert [(r.computed, r.generated, r.last_token) for r in fast.running] == [
        (r.computed, r.generated, r.last_token) for r in slow.running
    ]
    assert fast.num_free_blocks == slow.num_free_blocks and fast.generation_tokens == slow.generation_tokens


def test_decode_steps_stops_before_a_step_starting_at_the_next_arrival_and_not_with_work_waiting() -> None:
    eng = _engine(1000)
    t0 = _prefilled(eng, 50)
    one = decode_steps(eng, t0, t0 + 1e-9)
    assert len(one) == 1  # the first step starts before the arrival, the second would not
    eng.add(SimRequest("late", 100, 2), one[0])
    assert decode_steps(eng, one[0], float("inf")) == []  # a request waits: the scheduler admits it


def test_decode_steps_needs_every_block_of_the_run_free() -> None:
    eng = _engine(8)  # 8 blocks of 16 tokens: 100 + 1 tokens hold 7, the run past 112 needs an 8th and 9th
    t0 = _prefilled(eng, 40)
    assert decode_steps(eng, t0, float("inf")) == []
    assert eng.num_free_blocks == 1  # nothing taken
