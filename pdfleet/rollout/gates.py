"""The pure gate decisions: one measurement against one gate, and a tick's measurements against a step.

Argo's semantics: a failed measurement counts against `failure_limit` (past it: roll back), a metrics
error counts against `consecutive_error_limit` (reset by any tick without one; past it: roll back, no
one can see), too few samples or no data by the deadline is inconclusive (pause and say why). Dry-run
gates are measured and reported, never decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pdfleet.metrics.bounds import BUCKETS, bucket_of, same_bucket
from pdfleet.model.rollout import SLO_FIELD, GateSpec

Outcome = Literal["pass", "fail", "inconclusive", "error"]
# The histogram a latency gate's quantile is read from (`measure.HISTOGRAMS` reads the same series; a
# test holds the two together): its buckets say when a comparison is only between interpolations.
GATE_HISTOGRAMS = {
    "ttft": "pdfleet_gateway_ttft_seconds",
    "itl": "pdfleet_gateway_chunk_gap_seconds",
    "request": "pdfleet_gateway_request_duration_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "kv_transfer": "vllm:nixl_xfer_time_seconds",
}
# an analysis run's phase, as Argo Rollouts names an AnalysisRun's (the bench's Verdict is another thing)
AnalysisPhase = Literal["running", "successful", "failed", "inconclusive", "error"]


@dataclass(frozen=True)
class Observation:
    """One gate measured in one length class: the disaggregated value, the colocated baseline (None:
    no data), the disaggregated pool's share of the class, or the metrics error that stopped it."""

    gate: str
    length_class: str
    value: float | None = None
    baseline: float | None = None
    weight: int = 0
    error: str | None = None


@dataclass(frozen=True)
class GateResult:
    """A gate's outcome with the value and the threshold it was held to (what status and the log show)."""

    gate: str
    length_class: str
    outcome: Outcome
    value: float | None
    threshold: float | None
    message: str
    dry_run: bool = False
    # the value and what it was held to lie in one histogram bucket: the outcome rests on interpolation
    interpolated: bool = False


@dataclass(frozen=True)
class Counters:
    """Argo's running counts across ticks: failed measurements, metrics errors in a row."""

    failed_checks: int = 0
    consecutive_errors: int = 0


@dataclass(frozen=True)
class Limits:
    failure_limit: int = 0
    consecutive_error_limit: int = 4


@dataclass(frozen=True)
class AnalysisVerdict:
    verdict: AnalysisPhase
    counters: Counters
    reason: str


# The profile's `slo:` section as field -> ms (ttft_p99_ms, ...): host code does not import the profile.
Slo = Mapping[str, float]


def absolute_bound(gate: GateSpec, slo: Slo) -> float | None:
    """The gate's absolute bound in its own unit (`slo`: the profile's P99 target for the metric)."""
    if gate.max == "slo":
        return float(slo[SLO_FIELD[gate.metric]])
    return gate.max


def interpolation_note(metric: str, value_ms: float, against_ms: Sequence[float]) -> str:
    """Why a comparison of `value_ms` with the thresholds `against_ms` rests on interpolation
    ("" when it does not): a quantile only knows its histogram bucket, so a value and a threshold in one
    bucket cannot be ordered (`metrics.bounds`). Other metrics (rates, counts) are not quantiles."""
    bounds = BUCKETS.get(GATE_HISTOGRAMS.get(metric, ""), ())
    for other in against_ms:
        if same_bucket(value_ms / 1000, other / 1000, bounds):
            b = bucket_of(value_ms / 1000, bounds)
            return (
                f" (interpolated: {value_ms:.4g} and {other:.4g} ms both lie in the histogram's "
                f"{1000 * b.lower:g}-{1000 * b.upper:g} ms bucket, which cannot tell them apart)"
            )
    return ""


def evaluate_gate(gate: GateSpec, obs: Observation, slo: Slo) -> GateResult:
    """Hold one observation to its gate: the absolute bound first, then the ratio to the baseline.

    A latency quantile held to a threshold in its own histogram bucket (the bound, or the ratio times the
    baseline) still
    decides, as Argo would, but the result says it rests on interpolation (`interpolated`)."""

    def result(outcome: Outcome, threshold: float | None, message: str) -> GateResult:
        note = ""
        if obs.value is not None and threshold is not None:
            note = interpolation_note(gate.metric, obs.value, [threshold])
        return GateResult(
            gate.name,
            obs.length_class,
            outcome,
            obs.value,
            threshold,
            f"{gate.name} ({obs.length_class}): {message}{note}",
            gate.dry_run,
            interpolated=bool(note),
        )

    if obs.error is not None:
        return result("error", None, f"metrics error: {obs.error}")
    if obs.value is None:
        return result("inconclusive", None, "no data from the disaggregated pool in the window")
    bound = absolute_bound(gate, slo)
    if bound is not None and obs.value > bound:
        return result("fail", bound, f"{obs.value:.4g} > {bound:.4g}")
    if gate.max_ratio is None:
        return result("pass", bound, f"{obs.value:.4g} <= {bound:.4g}")
    if obs.weight >= 100:
        # the whole class is on the disaggregated pool: what the window still holds of the colocated
        # pool was measured under another load, not a baseline
        return result("pass", bound, f"{obs.value:.4g}; no colocated baseline at 100%, absolute only")
    if obs.baseline is None:
        return result("inconclusive", None, "no data from the colocated pool (the baseline) in the window")
    limit = gate.max_ratio * obs.baseline
    if obs.value > limit:
        return result("fail", limit, f"{obs.value:.4g} > {gate.max_ratio:g} x colocated {obs.baseline:.4g}")
    return result("pass", limit, f"{obs.value:.4g} <= {gate.max_ratio:g} x colocated {obs.baseline:.4g}")


def decide_tick(
    results: Sequence[GateResult],
    counters: Counters,
    limits: Limits,
    *,
    samples: int,
    min_samples: int,
) -> AnalysisVerdict:
    """One tick's outcome from its gate results: failed or errored past the limits, else `running`.

    A failure counts only when the window holds `min_samples` requests (a breach is measurable then).
    """
    deciding = [r for r in results if not r.dry_run]
    errors = [r for r in deciding if r.outcome == "error"]
    if errors:
        n = counters.consecutive_errors + 1
        new = Counters(counters.failed_checks, n)
        if n > limits.consecutive_error_limit:
            return AnalysisVerdict("error", new, f"{n} metrics errors in a row: {errors[0].message}")
        return AnalysisVerdict(
            "running",
            new,
            f"metrics error {n} of {limits.consecutive_error_limit} allowed in a row: {errors[0].message}",
        )
    fails = [r for r in deciding if r.outcome == "fail"]
    if fails and samples >= min_samples:
        n = counters.failed_checks + 1
        new = Counters(n, 0)
        if limits.failure_limit >= 0 and n > limits.failure_limit:
            return AnalysisVerdict("failed", new, "gate failed: " + "; ".join(r.message for r in fails))
        return AnalysisVerdict(
            "running",
            new,
            f"failed check {n} of {limits.failure_limit} allowed: " + "; ".join(r.message for r in fails),
        )
    return AnalysisVerdict("running", Counters(counters.failed_checks, 0), "")


def decide_analysis(
    results: Sequence[GateResult],
    counters: Counters,
    limits: Limits,
    *,
    samples: int,
    min_samples: int,
    elapsed_s: float,
    min_duration_s: float,
    deadline_s: float,
) -> AnalysisVerdict:
    """An analysis step's outcome: a tick's failure or error first; then successful once it has run
    `min_duration_s` with `min_samples` and every deciding gate passed; inconclusive past the deadline."""
    tick = decide_tick(results, counters, limits, samples=samples, min_samples=min_samples)
    if tick.verdict != "running" or tick.reason:
        return tick
    if samples < min_samples:
        why = f"{samples} of {min_samples} samples in the window"
        if elapsed_s >= deadline_s:
            return AnalysisVerdict(
                "inconclusive", tick.counters, f"too little traffic: {why} after {elapsed_s:.0f} s"
            )
        return AnalysisVerdict("running", tick.counters, f"waiting for samples: {why}")
    unknown = [r for r in results if not r.dry_run and r.outcome == "inconclusive"]
    if unknown:
        if elapsed_s >= deadline_s:
            return AnalysisVerdict("inconclusive", tick.counters, "; ".join(r.message for r in unknown))
        return AnalysisVerdict("running", tick.counters, "waiting for data: " + unknown[0].message)
    if elapsed_s < min_duration_s:
        return AnalysisVerdict(
            "running",
            tick.counters,
            f"gates pass; {min_duration_s - elapsed_s:.0f} s to the step's minimum duration",
        )
    return AnalysisVerdict("successful", tick.counters, "every gate passed")
