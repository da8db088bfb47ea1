"""Decode-only stretches in one call: the steps `Engine.schedule` + `Engine.complete` would take while
nothing can change the batch, computed in a tight loop (the planner's speed: a decode step is most of a
run's steps, and each costs the scheduler a pass over every running request).

Valid only when nothing waits or loads, every running request decodes (one token a step, all within the
budget), prefix caching is off and the blocks for the whole stretch are free: then each step's batch and
duration are known in advance, and the result is the scheduler's to the last float (tests/unit/sim).
"""

from __future__ import annotations

from pdfleet.sim.engine import Engine


def decode_steps(engine: Engine, now: float, until: float) -> list[float]:
    """Run decode-only steps back to back from `now`, as `schedule` + `complete` would, while nothing
    can change the batch; returns their end times (each running request emitted one token at each).

    Only when nothing waits or loads, every running request decodes (one token a step, all within the
    budget), prefix caching is off and the blocks for the whole run are free: then each step's batch
    and duration are known in advance. Stops before the step in which the first request would finish
    (left to `complete`), and before a step starting at or after `until` (the caller's next arrival:
    it must be admitted first). Returns [] when none can run this way.
    """
    running = engine.running
    b = len(running)
    if not b or engine.waiting or engine.loading or engine.limits.enable_prefix_caching:
        return []
    if b > engine.limits.max_num_batched_tokens:
        return []
    k = min(r.max_tokens - r.generated for r in running) - 1  # steps before the first finish
    ctx_sum = 0
    for r in running:
        if r.prompt_tokens + r.generated - r.computed != 1:
            return []  # a prefill chunk still to run: the scheduler's job
        ctx_sum += r.computed
    if k <= 0 or now >= until:
        return []
    step_time, perf_b = engine.perf.step_time, b
    ends: list[float] = []
    t = now
    while len(ends) < k and t < until:
        t += step_time(perf_b, ctx_sum + perf_b * 0.5, ctx_sum + perf_b, perf_b)
        ends.append(t)
        ctx_sum += perf_b
    if not _reserve_decode_blocks(engine, len(ends)):
        return []
    for r in running:
        r.computed += len(ends)
        r.generated += len(ends)
        r.prev_token = ends[-2] if len(ends) > 1 else r.last_token
        r.last_token = ends[-1]
    engine.generation_tokens += b * len(ends)
    return ends


def _reserve_decode_blocks(engine: Engine, steps: int) -> bool:
    """Blocks for `steps` more tokens of every running request, all or none."""
    bs = engine.limits.block_size
    need = [-(-(r.computed + steps) // bs) - len(r.block_ids) for r in engine.running]
    if sum(n for n in need if n > 0) > engine.pool.num_free:
        return False
    for r, n in zip(engine.running, need, strict=True):
        if n > 0:
            taken = engine.pool.take(n)
            assert taken is not None  # checked above
            r.block_ids.extend(taken)
    return True
