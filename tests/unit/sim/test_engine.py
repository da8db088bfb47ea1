"""The engine's scheduler on an injected clock: chunked prefill, batch caps, preemption, P/D holds."""

from __future__ import annotations

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.engine import Engine, EngineLimits, SimRequest, State
from tests.unit.sim.helpers import MODEL as MODEL_8B


def _engine(num_blocks: int, **kw: object) -> Engine:
    cfg = parse_serve_args([MODEL_8B], env={})
    return Engine(cfg.perf(), EngineLimits(num_blocks=num_blocks, **kw))  # type: ignore[arg-type]


def test_chunked_prefill_splits_a_prompt_within_the_token_budget() -> None:
    eng = _engine(10_000, max_num_batched_tokens=512)
    eng.add(SimRequest("a", 1300, 2), 0.0)
    sizes = []
    t = 0.0
    while eng.has_work():
        batch = eng.schedule(t)
        sizes.append(batch.tokens)
        t += batch.duration
        eng.complete(batch, t)
    assert sizes == [512, 512, 276, 1]


def test_without_chunking_whole_prompts_only() -> None:
    eng = _engine(10_000, max_num_batched_tokens=2048, enable_chunked_prefill=False)
    eng.add(SimRequest("a", 1500, 1), 0.0)
    eng.add(SimRequest("b", 1000, 1), 0.0)
    first = eng.schedule(0.0)
    assert [(r.request_id, n) for r, n in first.entries] == [("a", 1500)]
    eng.complete(first, first.duration)
    second = eng.schedule(first.duration)
    assert [(r.request_id, n) for r, n in second.entries] == [("b", 1000)]


def test_max_num_seqs_caps_the_running_batch() -> None:
    eng = _engine(10_000, max_num_seqs=3, max_num_batched_tokens=4096)
    for i in range(5):
        eng.add(SimRequest(f"r{i}", 10, 5), 0.0)
    batch = eng.schedule(0.0)
    assert len(batch.entries) == 3 and eng.num_waiting == 2


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    # 4 blocks of 16 tokens: two 16-token prompts fit, then decode needs a third and fourth block each
    eng = _engine(4, max_num_batched_tokens=4096)
    a, b = SimRequest("a", 16, 40), SimRequest("b", 16, 40)
    eng.add(a, 0.0)
    eng.add(b, 0.0)
    t = 0.0
    steps = 0
    while eng.has_work() and steps < 500:
        batch = eng.schedule(t)
        t += batch.duration
        eng.complete(batch, t)
        steps += 1
    assert eng.num_preemptions >= 1
    assert b.num_preemptions >= 1  # the tail of the running list is the victim
    assert a.state is State.FINISHED and b.state is State.FINISHED
    assert a.generated == 40 and b.generated == 40
    assert eng.num_free_blocks == 4


def test_producer_holds_blocks_until_released_or_expired() -> None:
    eng = _engine(1000, hold_timeout_s=30.0)
    req = SimRequest("p", 100, 1, remote_decode=True)
    eng.add(req, 0.0)
    batch = eng.schedule(0.0)
    eng.complete(batch, 0.1)
    assert req.state is State.FINISHED and len(req.block_ids) == 7
    assert eng.num_free_blocks == 993
    assert eng.expire_held(29.0) == []
    assert eng.release_held("p") is req and eng.num_free_blocks == 1000
    other = SimRequest("q", 100, 1, remote_decode=True)
    eng.add(other, 1.0)
    b2 = eng.schedule(1.0)
    eng.complete(b2, 1.1)
    assert eng.expire_held(31.2) == [other] and eng.num_free_blocks == 1000


def test_consumer_loads_remote_kv_then_computes_only_the_last_prompt_token() -> None:
    eng = _engine(1000)
    req = SimRequest("d", 500, 3, remote_prefill={"remote_request_id": "p"})
    eng.add(req, 0.0)
    batch = eng.schedule(0.0)
    assert batch.kv_loads == [req] and not batch.entries and len(req.block_ids) == 32
    assert eng.kv_loaded("d", ok=True) is None
    step = eng.schedule(0.05)
    assert step.entries == [(req, 1)]


def test_consumer_load_failure_policy() -> None:
    failing = _engine(1000, recompute_on_load_failure=False)
    req = SimRequest("d", 500, 3, remote_prefill={})
    failing.add(req, 0.0)
    failing.schedule(0.0)
    assert failing.kv_loaded("d", ok=False) is req and req.finish_reason == "error"
    assert failing.num_free_blocks == 1000
    recomputing = _engine(1000, recompute_on_load_failure=True)
    req2 = SimRequest("d", 500, 3, remote_prefill={})
    recomputing.add(req2, 0.0)
    recomputing.schedule(0.0)
    assert recomputing.kv_loaded("d", ok=False) is None
    assert recomputing.schedule(0.1).entries == [(req2, 500)]
