"""The decision: ranking, the reason each layout loses, and the two cases the issue names, predicted."""

from __future__ import annotations

import math

from pdfleet.bench.compare import BenchPlan
from pdfleet.bench.stats import Bounds
from pdfleet.bench.workloads import WorkloadSpec
from pdfleet.model import catalog
from pdfleet.plan.decide import Targets, choose, misses, rank
from pdfleet.plan.predict import Prediction, simulate
from pdfleet.plan.space import THRESHOLDS, Hardware, Layout, PoolShape, search_space
from pdfleet.plan.traffic import load_of, requests_of

HW = Hardware(catalog.GPUS["H100-SXM"], catalog.MODELS["Llama-3.1-8B"], catalog.LINKS["roce-400g"])


def _pred(
    name: int, ttft: float, tpot: float, itl: float, goodput: float, kind: str = "colocated"
) -> Prediction:
    layout = (
        Layout(colocated=PoolShape(name, 1, 8192))
        if kind == "colocated"
        else Layout(None, PoolShape(name, 1, 8192), PoolShape(1, 1, 2048))
    )
    summary = {
        "p95_ttft_ms": ttft,
        "p95_tpot_ms": tpot,
        "p99_itl_ms": itl,
        "slo_attainment_pct": 100.0,
        "failed": 0,
    }
    return Prediction(layout, summary, {}, {"request_goodput_per_gpu": goodput}, {})


T = Targets(ttft_p95_ms=1000, tpot_p95_ms=50, itl_p99_ms=100, kv_transfer_p99_ms=500, attainment_pct=90)


def test_misses_name_the_target_and_by_how_much_largest_first() -> None:
    found = misses(_pred(1, 1200, 75, 90, 1.0), T)
    assert [str(m) for m in found] == [
        "TPOT P95 75.0 ms > 50 ms (by 50%)",
        "TTFT P95 1200.0 ms > 1000 ms (by 20%)",
    ]


def test_a_figure_not_predicted_counts_as_missed() -> None:
    assert [m.what for m in misses(_pred(1, math.nan, 10, 10, 1.0), T)] == ["TTFT P95"]


def test_ranking_puts_layouts_meeting_every_target_first_then_goodput_then_itl() -> None:
    a = _pred(1, 500, 20, 50, 1.00)
    b = _pred(2, 500, 20, 30, 0.999)  # same goodput within 1%, lower ITL: ranks above a
    c = _pred(3, 500, 20, 10, 0.80)
    d = _pred(4, 5000, 20, 10, 2.00)  # best goodput, but misses TTFT
    rows = rank([a, b, c, d], T)
    assert [r.prediction for r in rows] == [b, a, c, d]
    assert rows[0].loses == "-"
    assert rows[1].loses == "same goodput (within 1%); ITL P99 50.0 ms >= 30.0 ms"
    assert rows[2].loses.startswith("goodput 0.800/s per GPU < 1.000 (-20.0%)")
    assert rows[3].loses == "misses TTFT P95 5000.0 ms > 1000 ms (by 400%)"


def test_a_workload_with_no_long_prompts_keeps_colocated_and_says_why() -> None:
    """random 512 ± 50% tokens at 4 req/s for a minute on 2 GPUs: every layout is simulated, and the plan
    recommends colocated only because no prompt reaches a threshold."""
    bench = BenchPlan(WorkloadSpec(name="random", input_len=512, range_ratio=0.5), rate=4, duration_s=60)
    reqs = requests_of(bench)
    keep, _ = search_space(2, load_of(reqs, 60), HW, (1, 2))
    preds = [simulate(lay, reqs, HW, Bounds(3000, 60, 250), 8192) for lay in keep]
    targets = Targets(3000, 60, 200, 500, 90)
    d = choose(preds, targets, max(r.effective_tokens for r in reqs), min(THRESHOLDS))
    assert d.recommended is not None and d.recommended.prediction.layout.kind == "colocated"
    assert d.verdict is not None and d.verdict.decision == "do not split"
    assert d.why[0].startswith(
        "colocated only: no prompt reaches 4096 effective tokens (the longest has 768)"
    )
    assert any(p.layout.kind == "disagg" for p in preds)  # P/D was predicted, not skipped


def test_the_long_prompt_mix_where_colocated_misses_both_bounds_recommends_p_d() -> None:
    """The guide's long-prompt mix (one request in twenty a 16K-30K-token document) at 18 req/s on four
    one-GPU hosts, TTFT P95 <= 900 ms and TPOT P95 <= 15 ms: every colocated layout misses both with both
    queues over 500 ms (short prompts wait behind document prefills, short streams decode beside their
    chunks); P/D for the documents with colocated instances for the rest meets both, so the guide's rule
    says split and the plan recommends that layout."""
    bench = BenchPlan(WorkloadSpec(input_len=512, long_share=0.05), rate=18, duration_s=60)
    reqs = requests_of(bench)
    keep, _ = search_space(4, load_of(reqs, 15), HW, (1,))
    chosen = [
        lay for lay in keep if lay.kind == "colocated" or (lay.kind == "hybrid" and lay.threshold == 4096)
    ]
    assert len(chosen) >= 4
    preds = [simulate(lay, reqs, HW, Bounds(900, 15, 250), 8192) for lay in chosen]
    targets = Targets(900, 15, 200, 500, 90)
    d = choose(preds, targets, max(r.effective_tokens for r in reqs), min(THRESHOLDS))
    assert d.verdict is not None and d.verdict.decision == "split", d.verdict
    assert d.recommended is not None and d.recommended.prediction.layout.kind == "hybrid"
    assert d.why[0].startswith("the guide's rule on the best colocated-only layout")
    colocated = [r for r in d.rows if r.prediction.layout.kind == "colocated"]
    assert colocated and all({"TTFT P95", "TPOT P95"} <= {m.what for m in r.misses} for r in colocated)
