"""Interference on the discrete-event clock: a long prefill stalls colocated decode streams, not P/D ones.

This is the point of the simulator; runs are discrete-event (no sleeping), so these are not timings.
"""

from __future__ import annotations

import random

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.des import EngineNode, PDPair, PDPool, Record, Simulation, run_alone
from pdfleet.sim.engine import Engine
from tests.unit.sim.helpers import MODEL as MODEL_8B

BURST_AT = 1.0
WINDOW = 4.0


def _worst_gap(records: list[Record], start: float, end: float) -> float:
    worst = 0.0
    for rec in records:
        t = rec.token_times
        for a, b in zip(t, t[1:], strict=False):
            if a >= start and b <= end:
                worst = max(worst, b - a)
    return worst


def _colocated(burst: bool) -> tuple[float, float]:
    cfg = parse_serve_args([MODEL_8B, "--enable-chunked-prefill"], env={})
    sim = Simulation()
    node = EngineNode(sim, cfg.engine())
    streams = [node.submit(node.new_request(1024, 5000)) for _ in range(32)]
    long_rec: list[Record] = []
    if burst:
        sim.at(BURST_AT, lambda: long_rec.append(node.submit(node.new_request(30000, 16))))
    sim.run(until=BURST_AT + WINDOW)
    chunk_step = cfg.perf().prefill_only_time(cfg.max_num_batched_tokens - 32)
    if burst:
        assert long_rec[0].token_times, "the long prompt was never prefilled"
    return _worst_gap(streams, BURST_AT, BURST_AT + WINDOW), chunk_step


def _disaggregated(burst: bool) -> float:
    p_cfg = parse_serve_args(
        [MODEL_8B, "--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'], env={}
    )
    d_cfg = parse_serve_args(
        [
            MODEL_8B,
            "--sim-link",
            "roce-400g",
            "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}',
        ],
        env={},
    )
    sim = Simulation()
    pair = PDPair(sim, p_cfg.engine(), d_cfg.engine(), d_cfg.link, d_cfg.kv_bytes_per_token)
    streams = [pair.submit(1024, 5000) for _ in range(32)]
    long_rec: list[Record] = []
    if burst:
        sim.at(BURST_AT, lambda: long_rec.append(pair.submit(30000, 16)))
    sim.run(until=BURST_AT + WINDOW)
    if burst:
        assert long_rec[0].token_times, "the long prompt never reached the decode side"
        assert pair.transfers and pair.transfers[-1][1] == 30000 * d_cfg.kv_bytes_per_token
    return _worst_gap(streams, BURST_AT, BURST_AT + WINDOW)


def test_long_prefill_stalls_colocated_decode_streams() -> None:
    baseline, chunk_step = _colocated(burst=False)
    stalled, _ = _colocated(burst=True)
    assert stalled - baseline >= chunk_step, (baseline, stalled, chunk_step)


def test_long_prefill_does_not_stall_disaggregated_decode_streams() -> None:
    baseline = _disaggregated(burst=False)
    burst = _disaggregated(burst=True)
    assert burst <= 1.5 * baseline, (baseline, burst)


def test_pd_pool_round_robins_and_queues_transfers_on_each_consumers_link() -> None:
    """2 producers, 1 consumer: prefills alternate, both KVs cross the one consumer's link one after
    the other, the producers' held blocks are freed once read, and every request decodes to the end."""
    p_cfg = parse_serve_args([MODEL_8B, "--enable-chunked-prefill"], env={})
    sim = Simulation()
    pool = PDPool(
        sim, [p_cfg.engine(), p_cfg.engine()], [p_cfg.engine()], p_cfg.link, p_cfg.kv_bytes_per_token
    )
    recs = [pool.submit(8000, 4), pool.submit(8000, 4)]
    sim.run()
    assert [len(node.engine.held) for node in pool.producers] == [0, 0]
    assert [len(node.records) for node in pool.producers] == [1, 1]  # one prefill each
    assert all(len(r.token_times) == 4 for r in recs)
    one = p_cfg.link.transfer_time(8000 * p_cfg.kv_bytes_per_token)
    (_, first, _), (_, second, _) = pool.transfers
    assert abs(first - one) < 1e-9 and abs(second - 2 * one) < 1e-9  # the second waited for the first
    assert recs[0].prefill is not None and recs[0].prefill.first_scheduled == 0.0


def _on_the_queue(engine: Engine, arrivals: list[tuple[float, int, int]]) -> list[Record]:
    """The requests through an EngineNode on the event queue, each submitted at its time."""
    sim = Simulation()
    node = EngineNode(sim, engine, keep_steps=False)
    recs: list[Record] = []

    def arrive(prompt: int, out: int) -> None:
        recs.append(node.submit(node.new_request(prompt, out)))

    for at, prompt, out in arrivals:
        sim.at(at, arrive, prompt, out)
    sim.run()
    return recs


def test_run_alone_takes_the_steps_an_engine_node_takes_to_the_last_float() -> None:
    """The planner's loop (decode-only stretches in one call) against the event queue, on a mix of 16K-30K
    documents and short turns; with a small KV cache the runs preempt, and must still agree exactly."""
    for blocks, budget in ((None, 8192), (1500, 2048)):
        argv = [MODEL_8B, "--enable-chunked-prefill", "--max-num-batched-tokens", str(budget)]
        if blocks:
            argv += ["--num-gpu-blocks-override", str(blocks), "--max-model-len", "24000"]
        cfg = parse_serve_args(argv, env={})
        rng = random.Random(budget)
        t, arrivals = 0.0, []
        for _ in range(150):
            t += rng.expovariate(2.0)
            prompt = rng.randint(16000, 23000) if rng.random() < 0.2 else rng.randint(200, 800)
            arrivals.append((t, prompt, rng.randint(8, 200)))
        queued = cfg.engine()
        recs = _on_the_queue(queued, arrivals)
        alone_engine = cfg.engine()
        alone = run_alone(alone_engine, arrivals)
        assert [r.token_times for r in alone] == [r.token_times for r in recs]
        assert alone_engine.num_preemptions == queued.num_preemptions
        assert (alone_engine.num_preemptions > 0) == bool(blocks)
        assert all(len(r.token_times) == out for r, (_, _, out) in zip(alone, arrivals, strict=True))
