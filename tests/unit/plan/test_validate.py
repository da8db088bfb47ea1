"""`invoke plan --validate`'s decisions: which layouts the fleet measures, prediction against measurement
(within or outside 15%), the ranking on both (agree, disagree, not checked), what is skipped and why."""

from __future__ import annotations

import math
from typing import Any

from pdfleet.plan.decide import Targets
from pdfleet.plan.predict import Prediction
from pdfleet.plan.space import Layout, PoolShape
from pdfleet.plan.validate import err_pct, lines, pick, pool_layouts, validate

COLO = Layout(colocated=PoolShape(2, 1, 8192))
PD = Layout(None, PoolShape(1, 1, 8192), PoolShape(1, 1, 2048))
FLEET = pool_layouts(
    {"colocated": PoolShape(2, 1, 8192), "prefill": PoolShape(1, 1, 8192), "decode": PoolShape(1, 1, 2048)}
)
T = Targets(ttft_p95_ms=3000, tpot_p95_ms=60, itl_p99_ms=250, kv_transfer_p99_ms=500, attainment_pct=90)


def _classes(ttft: float, itl: float) -> dict[str, dict[str, float]]:
    figs = {"p95_ttft_ms": ttft, "p95_itl_ms": itl, "median_itl_ms": itl / 2, "p95_tpot_ms": itl}
    return {"short": figs, "long": {k: 2 * v for k, v in figs.items()}}


def _summary(ttft: float) -> dict[str, Any]:
    return {
        "p95_ttft_ms": ttft,
        "p95_tpot_ms": 20.0,
        "p99_itl_ms": 30.0,
        "slo_attainment_pct": 100.0,
        "failed": 0,
    }


def _pred(layout: Layout, ttft: float, itl: float, goodput: float) -> Prediction:
    return Prediction(layout, _summary(ttft), _classes(ttft, itl), {"request_goodput_per_gpu": goodput}, {})


def _measured(ttft: float, itl: float, goodput: float) -> dict[str, Any]:
    pdf = {"classes": _classes(ttft, itl), "per_gpu": {"request_goodput_per_gpu": goodput}}
    return {**_summary(ttft), "pdfleet": pdf}


def test_the_fleets_pools_are_the_layouts_it_measures() -> None:
    assert FLEET == {"colocated": COLO, "disagg": PD}
    assert pool_layouts({"colocated": None, "prefill": PoolShape(1, 1, 8192), "decode": None}) == {}


def test_pick_takes_the_best_two_the_fleet_serves_and_says_why_each_above_is_skipped() -> None:
    other = Layout(colocated=PoolShape(2, 1, 2048))
    hybrid = Layout(PoolShape(1, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 4096)
    last = Layout(colocated=PoolShape(4, 1, 8192))
    picks = pick([other, PD, hybrid, COLO, last], FLEET)
    assert [(p.rank, p.pool) for p in picks] == [(1, None), (2, "disagg"), (3, None), (4, "colocated")]
    assert picks[0].skipped == (
        "the fleet's colocated run is 2C tp1 b8192: a profile change and provision (colocated "
        "max_num_batched_tokens 8192 -> 2048) first"
    )
    assert str(picks[2].skipped).startswith("the fleet has no hybrid layout (its runs: colocated 2C tp1")


POOLS = {
    "colocated": PoolShape(2, 1, 8192),
    "prefill": PoolShape(1, 1, 8192),
    "decode": PoolShape(1, 1, 2048),
}
WHOLE = Layout(PoolShape(2, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 8192)


def test_with_the_gateways_threshold_the_whole_fleet_is_the_routed_layout() -> None:
    fleet = pool_layouts(POOLS, 8192)
    assert fleet == {"colocated": COLO, "disagg": PD, "routed": WHOLE}
    assert pool_layouts({**POOLS, "colocated": None}, 8192) == {"disagg": PD}  # no hybrid without colocated


def test_pick_measures_the_fleets_hybrid_through_the_routed_run_and_names_what_other_hybrids_need() -> None:
    fleet = pool_layouts(POOLS, 8192)
    moved = Layout(PoolShape(1, 1, 8192), PoolShape(2, 1, 8192), PoolShape(1, 1, 2048), 8192)
    lower = Layout(PoolShape(2, 1, 8192), PoolShape(1, 1, 16384), PoolShape(1, 1, 2048), 4096)
    below = Layout(colocated=PoolShape(4, 1, 8192))
    picks = pick([moved, lower, WHOLE, below], {"routed": fleet["routed"]})
    assert [(p.rank, p.pool) for p in picks] == [(1, None), (2, None), (3, "routed")]  # none after it
    assert picks[0].skipped == (
        "the fleet's routed run is 1P tp1 b8192 + 1D tp1 b2048 + 2C tp1 b8192 long>=8192: host moves "
        "(`invoke rebalance --to-plan`: colocated 2 -> 1, prefill 1 -> 2) first"
    )
    assert picks[1].skipped == (
        "the fleet's routed run is 1P tp1 b8192 + 1D tp1 b2048 + 2C tp1 b8192 long>=8192: a profile change "
        "and provision (prefill max_num_batched_tokens 8192 -> 16384, long_prompt_tokens 8192 -> 4096) first"
    )


def test_with_nothing_measurable_only_the_first_two_are_listed_as_skipped() -> None:
    others = [Layout(colocated=PoolShape(4, 1, b)) for b in (2048, 8192)] * 3
    picks = pick(others, FLEET)
    assert [(p.rank, p.pool) for p in picks] == [(1, None), (2, None)]


def test_within_15_percent_and_the_same_ranking_agree() -> None:
    preds = {"colocated": _pred(COLO, 1000, 10, 1.0), "disagg": _pred(PD, 1100, 9, 0.8)}
    meas = {"colocated": _measured(1050, 11, 1.0), "disagg": _measured(1000, 10, 0.8)}
    v = validate(preds, meas, T)
    assert v.within and math.isclose(v.worst_pct, 100 * (9 - 10) / 10 * -1)
    assert v.predicted_order == v.measured_order == ("colocated", "disagg")
    assert v.ranking == "agree"
    assert lines(v)[-1] == "ranking predicted: colocated, disagg; measured: colocated, disagg: agree"


def test_a_figure_outside_15_percent_is_named_and_fails_the_bar() -> None:
    preds = {"colocated": _pred(COLO, 1000, 10, 1.0)}
    v = validate(preds, {"colocated": _measured(1000, 12, 1.0)}, T)  # ITL -16.7%
    assert not v.within and math.isclose(v.worst_pct, 100 * 2 / 12)
    out = lines(v)
    assert any("ITL P95" in x and "outside the bar" in x for x in out)
    assert not any("ITL P50" in x and "outside the bar" in x for x in out)  # context, not judged
    assert "(NOT within 15%)" in out[-2]


def test_rankings_that_differ_disagree() -> None:
    preds = {"colocated": _pred(COLO, 1000, 10, 1.0), "disagg": _pred(PD, 1000, 10, 0.8)}
    meas = {"colocated": _measured(1000, 10, 0.7), "disagg": _measured(1000, 10, 0.8)}
    v = validate(preds, meas, T)
    assert v.within and v.ranking == "disagree"
    assert (v.predicted_order, v.measured_order) == (("colocated", "disagg"), ("disagg", "colocated"))


def test_with_one_layout_measured_the_ranking_is_not_checked_and_the_skipped_are_listed() -> None:
    skipped = pick([Layout(colocated=PoolShape(2, 1, 2048)), COLO], FLEET)[:1]
    v = validate(
        {"colocated": _pred(COLO, 1000, 10, 1.0)}, {"colocated": _measured(1000, 10, 1.0)}, T, skipped
    )
    assert v.ranking == "not checked: 1 layout(s) measured, 2 needed"
    assert any(x.startswith("skipped #1 2C tp1 b2048: the fleet's colocated run is") for x in lines(v))


def test_a_pool_whose_bench_failed_is_in_neither_ranking_and_a_missing_figure_is_not_within() -> None:
    preds = {"colocated": _pred(COLO, 1000, 10, 1.0), "disagg": _pred(PD, 1000, 10, 0.8)}
    meas = {"colocated": _measured(1000, math.nan, 1.0), "disagg": {"error": "disagg: connection refused"}}
    v = validate(preds, meas, T)
    assert v.measured_order == ("colocated",) and v.worst_pct == math.inf and not v.within
    assert math.isnan(err_pct(1.0, 0.0)) and math.isnan(err_pct(math.nan, 1.0)) and err_pct(11, 10) == 10.0


def test_a_ranked_hybrid_whose_threshold_routes_as_the_fleets_is_the_fleets() -> None:
    """The search keeps long>=4096 and cuts long>=8192 when no prompt has 4096-8191 effective tokens: the
    fleet's long>=8192 is then measured as the ranked long>=4096; another share is not."""
    fleet = pool_layouts(POOLS, 8192)
    twin = Layout(PoolShape(2, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 4096)
    same = {4096: (0.25, 23000.0), 8192: (0.25, 23000.0), 16384: (0.2, 24000.0)}
    assert [(p.rank, p.pool) for p in pick([twin], fleet, shares=same)] == [(1, "routed")]
    other = {**same, 4096: (0.3, 20000.0)}
    assert pick([twin], fleet, shares=other)[0].pool is None
    assert pick([twin], fleet)[0].pool is None  # without the traffic's shares: only the very layout
