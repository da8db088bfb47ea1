"""Interference on the discrete-event clock: a long prefill stalls colocated decode streams, not P/D ones.

This is the point of the simulator; runs are discrete-event (no sleeping), so these are not timings.
"""

from __future__ import annotations

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.des import EngineNode, PDPair, PDPool, Record, Simulation
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
