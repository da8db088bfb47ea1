"""One layout on the discrete-event driver: requests go where the gateway's rule sends them, every one
finishes, and the figures are bench's."""

from __future__ import annotations

import pytest

from pdfleet.bench.stats import Bounds, gaps, quantile
from pdfleet.model import catalog
from pdfleet.plan.predict import Request, client_record, run, simulate
from pdfleet.plan.space import Hardware, Layout, PoolShape

HW = Hardware(catalog.GPUS["H100-SXM"], catalog.MODELS["Llama-3.1-8B"], catalog.LINKS["roce-400g"])
BOUNDS = Bounds(3000, 60, 250)


def _traffic() -> list[Request]:
    """Two short requests a second for 20 s, and a 20K-token document every 5 s."""
    reqs = [Request(i * 0.5, 500, 64, 500) for i in range(40)]
    reqs += [Request(i * 5.0 + 0.25, 20000, 64, 20000) for i in range(4)]
    return sorted(reqs, key=lambda r: r.at)


def test_a_colocated_layout_serves_every_request_with_bench_figures() -> None:
    p = simulate(Layout(colocated=PoolShape(2, 1, 8192)), _traffic(), HW, BOUNDS, 8192)
    assert p.summary["completed"] == 44 and p.summary["failed"] == 0
    assert p.classes["long"]["completed"] == 4 and p.classes["short"]["completed"] == 40
    # a 20K-token prefill on one H100 takes hundreds of ms; a 500-token one tens
    assert p.classes["long"]["p95_ttft_ms"] > 300 > p.classes["short"]["median_ttft_ms"]
    assert p.to_pd == 0 and p.kv == {}
    assert p.queues_ms["prefill_queue_p95_ms"] == p.queues_ms["decode_queue_p95_ms"]


def test_a_hybrid_layout_sends_prompts_at_the_threshold_to_p_d_and_moves_their_kv() -> None:
    layout = Layout(PoolShape(1, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 8192)
    p = simulate(layout, _traffic(), HW, BOUNDS, 8192)
    assert p.to_pd == 4 and p.summary["completed"] == 44
    assert p.kv["kv_transfer_p95_ms"] > 0 and 0 < p.kv["kv_link_busy_pct"] < 100
    # 20K tokens x 128 KiB over 400 Gb/s at 71%: ~74 ms each, plus the 0.5 ms setup
    expected = HW.link.transfer_time(20000 * HW.kv_bytes_per_token) * 1000
    assert abs(p.kv["kv_transfer_p95_ms"] - expected) < 1


def test_p_d_alone_takes_every_request_whatever_its_length() -> None:
    layout = Layout(None, PoolShape(1, 1, 8192), PoolShape(1, 1, 2048))
    p = simulate(layout, _traffic(), HW, BOUNDS, 8192)
    assert p.to_pd == 44 and p.summary["completed"] == 44
    assert p.per_gpu["request_throughput_per_gpu"] == p.summary["request_throughput"] / 2


def test_run_hands_back_each_request_once_with_its_pool_and_the_gaps_the_figures_read() -> None:
    """bench/plan_fidelity.py compares these gaps with the lab instances' own and the client's."""
    layout = Layout(PoolShape(1, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 8192)
    traffic = _traffic()
    records, pd = run(layout, traffic, HW)
    assert sorted(r.at for r, _, _ in records) == [r.at for r in traffic]
    assert {r.prompt_tokens for r, pool, _ in records if pool == "disagg"} == {20000}
    assert pd is not None and len(pd.transfers) == 4
    pooled = sorted(g for r, _, rec in records for g in gaps(client_record(r, rec, 8192)))
    p = simulate(layout, traffic, HW, BOUNDS, 8192)
    assert p.summary["p95_itl_ms"] == pytest.approx(1000 * quantile(pooled, 0.95))
