"""The pure gate decisions, from constructed measurements: every outcome of a gate and every verdict of
a tick and of an analysis step (Argo's failure limit, consecutive-error limit, inconclusive, dry-run)."""

from __future__ import annotations

from pdfleet.model.rollout import GateSpec
from pdfleet.rollout.gates import (
    Counters,
    GateResult,
    Limits,
    Observation,
    absolute_bound,
    decide_analysis,
    decide_tick,
    evaluate_gate,
)

SLO = {"ttft_p99_ms": 3000.0, "tpot_p99_ms": 60.0, "itl_p99_ms": 200.0, "kv_transfer_p99_ms": 500.0}
RATIO = GateSpec(name="ttft-vs", metric="ttft", max_ratio=1.5)
BOTH = GateSpec(name="ttft-both", metric="ttft", max_ratio=1.5, max="slo")
KV = GateSpec(name="kv", metric="kv_transfer", max="slo")


def _obs(value=None, baseline=None, weight=10, error=None, gate="g") -> Observation:
    return Observation(gate, "long", value, baseline, weight, error)


def test_absolute_bound_reads_the_slo_or_the_number() -> None:
    assert absolute_bound(KV, SLO) == 500
    assert absolute_bound(GateSpec(name="e", metric="error_rate", max=0.01), SLO) == 0.01
    assert absolute_bound(RATIO, SLO) is None


def test_every_outcome_of_one_gate() -> None:
    assert evaluate_gate(RATIO, _obs(error="Prometheus down"), SLO).outcome == "error"
    assert evaluate_gate(RATIO, _obs(), SLO).outcome == "inconclusive"
    over = evaluate_gate(KV, _obs(value=650.0), SLO)
    assert (over.outcome, over.value, over.threshold) == ("fail", 650.0, 500)
    assert "kv (long): 650 > 500" in over.message
    assert evaluate_gate(KV, _obs(value=120.0), SLO).outcome == "pass"
    # the absolute bound fails before the ratio is looked at
    assert evaluate_gate(BOTH, _obs(value=3500.0, baseline=3000.0), SLO).outcome == "fail"
    ratio_fail = evaluate_gate(RATIO, _obs(value=400.0, baseline=200.0), SLO)
    assert (ratio_fail.outcome, ratio_fail.threshold) == ("fail", 300.0)
    assert "1.5 x colocated 200" in ratio_fail.message
    assert evaluate_gate(RATIO, _obs(value=250.0, baseline=200.0), SLO).outcome == "pass"
    assert evaluate_gate(RATIO, _obs(value=250.0, weight=50), SLO).outcome == "inconclusive"
    at_full = evaluate_gate(BOTH, _obs(value=250.0, weight=100), SLO)
    assert at_full.outcome == "pass" and "no colocated baseline at 100%" in at_full.message
    # the window still holds the colocated pool's figures from before the last step: not a baseline
    stale = evaluate_gate(BOTH, _obs(value=2500.0, baseline=900.0, weight=100), SLO)
    assert stale.outcome == "pass" and "no colocated baseline at 100%" in stale.message
    assert evaluate_gate(GateSpec(name="d", metric="ttft", max=1, dry_run=True), _obs(value=5.0), SLO).dry_run


def _r(outcome, dry_run=False) -> GateResult:
    return GateResult("g", "long", outcome, 1.0, 2.0, f"g: {outcome}", dry_run)


def test_a_tick_counts_errors_in_a_row_and_fails_past_the_limit() -> None:
    limits = Limits(failure_limit=0, consecutive_error_limit=2)
    v = decide_tick([_r("error")], Counters(0, 1), limits, samples=100, min_samples=10)
    assert (v.verdict, v.counters.consecutive_errors) == ("running", 2) and "error 2 of 2" in v.reason
    v = decide_tick([_r("error")], Counters(0, 2), limits, samples=100, min_samples=10)
    assert v.verdict == "error" and "3 metrics errors in a row" in v.reason
    v = decide_tick([_r("pass")], Counters(0, 2), limits, samples=100, min_samples=10)
    assert (v.verdict, v.counters.consecutive_errors, v.reason) == ("running", 0, "")


def test_a_tick_fails_past_the_failure_limit_only_with_enough_samples() -> None:
    v = decide_tick([_r("fail")], Counters(), Limits(0, 4), samples=100, min_samples=10)
    assert v.verdict == "failed" and "gate failed: g: fail" in v.reason
    v = decide_tick([_r("fail")], Counters(), Limits(1, 4), samples=100, min_samples=10)
    assert (v.verdict, v.counters.failed_checks) == ("running", 1) and "failed check 1 of 1" in v.reason
    second = decide_tick([_r("fail")], Counters(1), Limits(1, 4), samples=100, min_samples=10)
    assert second.verdict == "failed"
    never = decide_tick([_r("fail")], Counters(50), Limits(-1, 4), samples=100, min_samples=10)
    assert never.verdict == "running"
    assert decide_tick([_r("fail")], Counters(), Limits(0, 4), samples=9, min_samples=10).verdict == "running"
    assert (
        decide_tick(
            [_r("fail", True), _r("error", True)], Counters(), Limits(0, 0), samples=100, min_samples=10
        ).verdict
        == "running"
    )


def _analysis(results, samples=100, elapsed=40.0, counters=Counters(0, 0)):  # noqa: B008 (frozen)
    return decide_analysis(
        results,
        counters,
        Limits(0, 4),
        samples=samples,
        min_samples=50,
        elapsed_s=elapsed,
        min_duration_s=30,
        deadline_s=120,
    )


def test_every_verdict_of_an_analysis_step() -> None:
    assert _analysis([_r("pass")]).verdict == "successful"
    assert _analysis([_r("pass"), _r("fail", dry_run=True)]).verdict == "successful"
    assert _analysis([_r("fail")]).verdict == "failed"
    assert _analysis([_r("error")], counters=Counters(0, 4)).verdict == "error"
    assert _analysis([_r("error")]).verdict == "running"
    early = _analysis([_r("pass")], elapsed=10)
    assert early.verdict == "running" and "20 s to the step's minimum duration" in early.reason
    few = _analysis([_r("pass")], samples=5)
    assert few.verdict == "running" and "5 of 50 samples" in few.reason
    starved = _analysis([_r("pass")], samples=5, elapsed=130)
    assert starved.verdict == "inconclusive" and "too little traffic: 5 of 50 samples" in starved.reason
    assert _analysis([_r("inconclusive")]).verdict == "running"
    no_data = _analysis([_r("inconclusive")], elapsed=130)
    assert no_data.verdict == "inconclusive" and "g: inconclusive" in no_data.reason
    # a failure with too few samples is not measurable yet: the step waits
    assert _analysis([_r("fail")], samples=5).verdict == "running"


def test_each_bound_is_inclusive_and_one_step_past_it_fails() -> None:
    """The gates' boundaries (a `>` mutated to `>=`, or the reverse, fails one of these)."""
    assert evaluate_gate(KV, _obs(value=500.0), SLO).outcome == "pass"
    assert evaluate_gate(KV, _obs(value=500.001), SLO).outcome == "fail"
    assert evaluate_gate(RATIO, _obs(value=300.0, baseline=200.0), SLO).outcome == "pass"
    assert evaluate_gate(RATIO, _obs(value=300.001, baseline=200.0), SLO).outcome == "fail"
    # at 99% the colocated pool is still a baseline; at 100% only the absolute bound holds
    assert evaluate_gate(RATIO, _obs(value=400.0, baseline=200.0, weight=99), SLO).outcome == "fail"
    assert evaluate_gate(RATIO, _obs(value=400.0, baseline=200.0, weight=100), SLO).outcome == "pass"


def test_a_failure_counts_from_exactly_min_samples_and_rolls_back_one_past_the_limit() -> None:
    def tick(samples: int, failed: int, limit: int) -> str:
        return decide_tick(
            [_r("fail")], Counters(failed), Limits(limit, 4), samples=samples, min_samples=10
        ).verdict

    assert tick(samples=9, failed=0, limit=0) == "running"
    assert tick(samples=10, failed=0, limit=0) == "failed"
    assert tick(samples=10, failed=1, limit=2) == "running"  # the 2nd failure of 2 allowed
    assert tick(samples=10, failed=2, limit=2) == "failed"  # the 3rd
    errors = Limits(0, 3)
    assert decide_tick([_r("error")], Counters(0, 2), errors, samples=0, min_samples=10).verdict == "running"
    assert decide_tick([_r("error")], Counters(0, 3), errors, samples=0, min_samples=10).verdict == "error"


def test_an_analysis_ends_exactly_at_its_minimum_duration_and_its_deadline() -> None:
    assert _analysis([_r("pass")], elapsed=30.0).verdict == "successful"
    assert _analysis([_r("pass")], elapsed=29.99).verdict == "running"
    assert _analysis([_r("pass")], samples=50, elapsed=30.0).verdict == "successful"
    assert _analysis([_r("pass")], samples=49, elapsed=119.99).verdict == "running"
    assert _analysis([_r("pass")], samples=49, elapsed=120.0).verdict == "inconclusive"
    assert _analysis([_r("inconclusive")], elapsed=119.99).verdict == "running"
    assert _analysis([_r("inconclusive")], elapsed=120.0).verdict == "inconclusive"


def test_a_gate_says_when_it_decides_inside_one_histogram_bucket() -> None:
    """TPOT's histogram has a 0.1-0.15 s bucket: 120 ms against a 140 ms bound passes, but says the
    histogram cannot tell them apart; 60 ms against it is a real pass; rates are not quantiles."""
    tpot = GateSpec(name="tpot", metric="tpot", max=140.0)
    inside = evaluate_gate(tpot, _obs(value=120.0), SLO)
    assert inside.outcome == "pass" and inside.interpolated
    assert "interpolated: 120 and 140 ms both lie in the histogram's 100-150 ms bucket" in inside.message
    over = evaluate_gate(GateSpec(name="tpot", metric="tpot", max=110.0), _obs(value=120.0), SLO)
    assert over.outcome == "fail" and over.interpolated and "interpolated" in over.message
    clear = evaluate_gate(tpot, _obs(value=60.0), SLO)
    assert clear.outcome == "pass" and not clear.interpolated and "interpolated" not in clear.message
    ratio = evaluate_gate(RATIO, _obs(value=3.0, baseline=2.2), SLO)  # limit 3.3 ms: TTFT's first bucket
    assert ratio.outcome == "pass" and ratio.interpolated and "0-5 ms bucket" in ratio.message
    rate = evaluate_gate(GateSpec(name="e", metric="error_rate", max=0.01), _obs(value=0.009), SLO)
    assert not rate.interpolated


def test_the_gates_read_the_histograms_measure_reads() -> None:
    from pdfleet.rollout.gates import GATE_HISTOGRAMS
    from pdfleet.rollout.measure import HISTOGRAMS

    assert GATE_HISTOGRAMS == HISTOGRAMS
