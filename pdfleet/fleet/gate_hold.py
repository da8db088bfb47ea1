"""A gate hold after a rebalance move (`invoke rebalance --to-plan`, issue 35): the profile's rollout gates
measured and decided with the rollout's own machinery, as an analysis step holds a rollout: every
`rollout.interval_s` each gate is measured over `rollout.window_s` (pdfleet.rollout.measure.observe), held to
its bounds (gates.evaluate_gate) and the tick decided (gates.decide_analysis, with the profile's failure and
error limits and `rollout.min_samples`), from the first tick whose window holds only traffic after the move
(none is decided before `rollout.window_s` has passed: the window would still hold the move's own drain and
router restart). The hold passes once it has run `hold_s` (at least the window) with every deciding gate
passing; a failed gate or too many
metrics errors fail it, and so does too little traffic by its deadline (4 x hold_s): a move nobody could
measure is not one to build the next on.

The gates compare the disaggregated pool with the colocated one per length class; the classes held are
those the gateways sent to the disaggregated pool in the window, each with its measured share (the weight a
gate's baseline rule reads). With none (the stage sends nothing to P/D) there is nothing to hold: the hold
says so and passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pdfleet.metrics.source import MetricsError, MetricsSource, SeriesAbsent
from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.stages import LENGTH_CLASSES, StageSpec
from pdfleet.rollout.gates import Counters, Limits, decide_analysis, evaluate_gate
from pdfleet.rollout.measure import DECISIONS, KV_SERIES, observe

DEADLINE_FACTOR = 4  # an analysis step's default deadline: 4 x its minimum duration


@dataclass(frozen=True)
class GateConfig:
    """What a hold measures with: the profile's rollout section and SLO, the KV histogram and its role."""

    rollout: RolloutSpec
    slo: Mapping[str, float]
    kv: tuple[str, str] | None = KV_SERIES  # None: the pools export no KV-transfer histogram
    model: str | None = None


@dataclass(frozen=True)
class HoldOutcome:
    ok: bool
    reason: str
    ticks: int


def routed_share(source: MetricsSource, window_s: float, model: str | None = None) -> StageSpec | None:
    """Each length class's share of the gateways' decisions sent to the disaggregated pool in the window
    (percent), or None when none went there."""
    match = {"model": model} if model is not None else None
    try:
        got = source.increase(DECISIONS, window_s, by=("length_class", "pool"), match=match)
    except SeriesAbsent:
        return None
    share = {}
    for cls in LENGTH_CLASSES:
        disagg = got.get((cls, "disagg"), 0.0)
        total = disagg + got.get((cls, "colocated"), 0.0)
        share[cls] = round(100 * disagg / total) if total > 0 else 0
    if not any(share.values()):
        return None
    return StageSpec(**share)


def hold(
    source: MetricsSource,
    config: GateConfig,
    hold_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> HoldOutcome:
    """Hold the fleet to the gates (see the module docstring)."""
    spec = config.rollout
    limits = Limits(spec.failure_limit, spec.consecutive_error_limit)
    counters = Counters()
    started = clock()
    ticks = 0
    while True:
        sleep(spec.interval_s)
        ticks += 1
        elapsed = clock() - started
        try:
            weights = routed_share(source, spec.window_s, config.model)
        except MetricsError as exc:
            weights, error = None, str(exc)
        else:
            error = ""
        if elapsed < spec.window_s:  # the window still holds the move's own traffic (its router restart)
            continue
        if weights is None and not error:
            if elapsed < hold_s:
                continue
            return HoldOutcome(
                True,
                f"no length class went to the disaggregated pool in the last "
                f"{spec.window_s} s: no gate to hold",
                ticks,
            )
        classes = [c for c in LENGTH_CLASSES if weights is not None and getattr(weights, c) > 0]
        kv = config.kv or KV_SERIES
        observed, samples = observe(
            source,
            spec.gates,
            weights or StageSpec(short=0, long=0),
            classes or list(LENGTH_CLASSES),
            spec.window_s,
            config.kv is not None,
            config.model,
            kv,
        )
        results = [evaluate_gate(g, o, config.slo) for g, o in observed]
        verdict = decide_analysis(
            results,
            counters,
            limits,
            samples=samples,
            min_samples=spec.min_samples,
            elapsed_s=elapsed,
            min_duration_s=hold_s,
            deadline_s=DEADLINE_FACTOR * hold_s,
        )
        counters = verdict.counters
        if verdict.verdict == "successful":
            shown = "; ".join(r.message for r in results if not r.dry_run)
            return HoldOutcome(True, f"{verdict.reason} over {elapsed:.0f} s ({shown})", ticks)
        if verdict.verdict != "running":
            return HoldOutcome(False, f"{verdict.verdict}: {verdict.reason}", ticks)
        if verdict.reason and ticks % 5 == 1:
            say(f"      gates: {verdict.reason}")
