"""The verdict rule on constructed figures: one test per branch, with the numbers that decided it."""

from __future__ import annotations

from pdfleet.bench.verdict import PoolFigures, Thresholds, decide

T = Thresholds(ttft_p95_ms=1000, tpot_p95_ms=50, prefill_queue_p95_ms=500, decode_queue_p95_ms=500)
SLOW = PoolFigures(ttft_p95_ms=3000, tpot_p95_ms=120, prefill_queue_p95_ms=900, decode_queue_p95_ms=800)
GOOD_PD = PoolFigures(ttft_p95_ms=800, tpot_p95_ms=30, kv_transfer_p95_ms=20)


def test_colocated_meeting_both_bounds_does_not_split() -> None:
    v = decide(PoolFigures(500, 20, 100, 100), GOOD_PD, T)
    assert v.decision == "do not split" and "meets both" in v.headline
    assert v.deciding["colocated_ttft_p95_ms"] == 500 and v.deciding["tpot_p95_bound_ms"] == 50


def test_only_ttft_failing_says_tune_the_budget_up() -> None:
    v = decide(PoolFigures(3000, 20, 900, 900), GOOD_PD, T)
    assert v.decision == "do not split" and "only the TTFT" in v.headline
    assert "raise pools.colocated.max_num_batched_tokens" in v.advice[0]


def test_only_tpot_failing_says_tune_the_budget_down() -> None:
    v = decide(PoolFigures(500, 120, 900, 900), GOOD_PD, T)
    assert v.decision == "do not split" and "only the TPOT" in v.headline
    assert "lower pools.colocated.max_num_batched_tokens" in v.advice[0]


def test_both_failing_without_both_queues_long_is_capacity_not_pd() -> None:
    v = decide(PoolFigures(3000, 120, 900, 100), GOOD_PD, T)
    assert v.decision == "do not split" and "not both" in v.headline
    assert v.deciding["colocated_decode_queue_p95_ms"] == 100 and "rate-limit" in v.advice[0]


def test_both_failing_with_both_queues_long_and_pd_meeting_splits() -> None:
    v = decide(SLOW, GOOD_PD, T)
    assert v.decision == "split"
    assert v.deciding["disagg_ttft_p95_ms"] == 800 and v.deciding["colocated_prefill_queue_p95_ms"] == 900
    assert not v.warnings


def test_pd_missing_the_bounds_too_does_not_split() -> None:
    v = decide(SLOW, PoolFigures(1500, 30), T)
    assert v.decision == "do not split" and "P/D pool misses" in v.headline


def test_no_pd_measured_or_no_queue_figures_is_undecided() -> None:
    assert decide(SLOW, None, T).decision == "undecided"
    assert decide(PoolFigures(3000, 120, None, None), GOOD_PD, T).decision == "undecided"
    assert decide(PoolFigures(None, None), GOOD_PD, T).decision == "undecided"


def test_kv_transfer_p95_over_200_ms_is_warned_whatever_the_verdict() -> None:
    slow_link = PoolFigures(800, 30, kv_transfer_p95_ms=250)
    assert any("KV transfer P95 is 250 ms" in w for w in decide(SLOW, slow_link, T).warnings)
    assert decide(PoolFigures(500, 20), slow_link, T).warnings
    assert not decide(PoolFigures(500, 20), PoolFigures(800, 30, kv_transfer_p95_ms=200), T).warnings
