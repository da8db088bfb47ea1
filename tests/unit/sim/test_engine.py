"""The engine's scheduler on an injected clock: chunked prefill, batch caps, preemption, P/D holds."""

from __future__ import annotations

from pdfleet.sim.blocks import block_hashes
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


# ---- the prefix cache (vLLM's automatic prefix caching) ------------------------------------------------
def _run(eng: Engine, t: float = 0.0) -> float:
    while eng.has_work():
        batch = eng.schedule(t)
        t += batch.duration
        eng.complete(batch, t)
    return t


def _hashed(rid: str, units: list[int], max_tokens: int = 2) -> SimRequest:
    return SimRequest(rid, len(units), max_tokens, block_hashes=block_hashes(units, 16))


def test_a_shared_prefix_is_counted_in_tokens_and_skips_its_prefill() -> None:
    eng = _engine(10_000, enable_prefix_caching=True)
    first = _hashed("a", list(range(1000)))
    eng.add(first, 0.0)
    t = _run(eng)
    # same first 900 tokens, then different ones: 56 full blocks (896 tokens) are cached
    second = _hashed("b", [*range(900), *range(5000, 5100)])
    eng.add(second, t)
    _run(eng, t)
    assert eng.prefix_cache_queries == 1000 + 1000  # every lookup, in prompt tokens (request.num_tokens)
    assert eng.prefix_cache_hits == 896
    ttft_first = first.first_token - first.arrival  # type: ignore[operator]
    ttft_second = second.first_token - second.arrival  # type: ignore[operator]
    assert ttft_second < 0.5 * ttft_first


def test_a_prompt_seen_whole_still_computes_its_last_block() -> None:
    eng = _engine(10_000, enable_prefix_caching=True)
    units = list(range(64))  # 4 full blocks
    eng.add(_hashed("a", units), 0.0)
    t = _run(eng)
    again = _hashed("b", units)
    eng.add(again, t)
    batch = eng.schedule(t)
    # num_tokens - 1 = 63 tokens may hit: 3 blocks (48 tokens); the last block is recomputed for the logits
    assert batch.entries == [(again, 16)] and eng.prefix_cache_hits == 48


def test_with_caching_off_nothing_is_looked_up_or_reused() -> None:
    eng = _engine(10_000, enable_prefix_caching=False)
    eng.add(_hashed("a", list(range(500))), 0.0)
    t = _run(eng)
    again = _hashed("b", list(range(500)))
    eng.add(again, t)
    assert eng.schedule(t).entries == [(again, 500)]
    assert (eng.prefix_cache_queries, eng.prefix_cache_hits) == (0, 0)


def test_the_cache_is_bounded_by_the_kv_blocks() -> None:
    # 40 blocks: a 512-token prompt (32 blocks) is cached, then another prompt needs its blocks back
    eng = _engine(40, enable_prefix_caching=True, max_num_batched_tokens=4096)
    eng.add(_hashed("a", list(range(512))), 0.0)
    t = _run(eng)
    assert eng.pool.num_cached == 32 and eng.num_free_blocks == 40
    eng.add(_hashed("b", list(range(10_000, 10_600))), t)
    t = _run(eng, t)
    again = _hashed("c", list(range(512)))
    eng.add(again, t)
    eng.schedule(t)
    # b took 38 of the 40 blocks: the 8 never used, then a's, tail first: a's first two blocks survive
    assert eng.prefix_cache_hits == 32


def test_a_preempted_request_s_lookup_is_counted_as_the_release_counts_it() -> None:
    counted = {}
    for skip in (False, True):
        eng = _engine(
            5, enable_prefix_caching=True, max_num_batched_tokens=4096, prefix_stats_skip_preempted=skip
        )
        a, b = _hashed("a", list(range(16)), 40), _hashed("b", list(range(100, 116)), 40)
        eng.add(a, 0.0)
        eng.add(b, 0.0)
        _run(eng)
        assert eng.num_preemptions >= 1
        counted[skip] = eng.prefix_cache_queries
    assert counted[True] == 32  # 0.33: only the two first lookups
    assert counted[False] > 32  # 0.11: every lookup, the re-admissions after preemption too
