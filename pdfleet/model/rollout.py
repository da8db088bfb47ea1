"""The profile's `rollout:` section: per target stage, the Argo-style steps that reach it, and the gates.

A plan is a list of steps: `set_weight` (percent of each length class sent to the disaggregated pool),
`analysis` (hold until the gates pass over at least `min_duration_s` and `min_samples` requests, fail
→ roll back, too few samples → pause, inconclusive), `pause` (for `duration_s`, or until
`rollout.promote` when it is absent) and `shadow` (issue 33: shadow `share` percent of a class's sticky
buckets to the disaggregated pool for the step, moving no user, and hold the shadow series to the gates
as an analysis holds the live ones). Gates compare the disaggregated pool with the colocated pool in
the same length class (`max_ratio`; in a shadow step: the shadow with its own primary request) and
check absolutes (`max`, or `slo` for the profile's own SLO).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from pdfleet.model.rebalancing import RebalanceSpec
from pdfleet.model.stages import LENGTH_CLASSES, StageSpec

LengthClass = Literal["short", "long"]

# What a gate can measure. Latencies are in ms; `error_rate` and `fallback_rate` are fractions of the
# disaggregated pool's requests; `stalls` are per minute.
GateMetric = Literal["ttft", "itl", "request", "tpot", "kv_transfer", "error_rate", "fallback_rate", "stalls"]
# Metrics that exist per length class at the gateway (the others are per pool: vLLM's own series).
CLASS_METRICS = ("ttft", "itl", "request", "error_rate", "stalls")
# What a shadow step can hold to a gate: the shadow series' own (per class) and vLLM's per pool; a shadow
# never falls back (its answer is thrown away), so fallback_rate has nothing to measure there.
SHADOW_METRICS = ("ttft", "itl", "request", "error_rate", "stalls", "tpot", "kv_transfer")
# Which SLO field `max: slo` means for a metric (P99 targets, in ms).
SLO_FIELD = {
    "ttft": "ttft_p99_ms",
    "tpot": "tpot_p99_ms",
    "itl": "itl_p99_ms",
    "kv_transfer": "kv_transfer_p99_ms",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class GateSpec(_Model):
    """One gate: a metric of the disaggregated pool against the colocated pool and/or an absolute bound."""

    name: str = Field(min_length=1, pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    metric: GateMetric
    quantile: float = Field(0.99, gt=0, lt=1)
    max_ratio: float | None = Field(None, gt=0)  # disagg value <= max_ratio * colocated value
    max: float | Literal["slo"] | None = None  # absolute bound (ms, fraction or per minute)
    dry_run: bool = False  # measured and logged, never fails the rollout (Argo's dryRun)

    @model_validator(mode="after")
    def _has_a_condition(self) -> GateSpec:
        if self.max_ratio is None and self.max is None:
            raise ValueError(f"gate {self.name!r}: set max_ratio (vs colocated), max, or both")
        if self.max == "slo" and self.metric not in SLO_FIELD:
            raise ValueError(f"gate {self.name!r}: max: slo needs one of {', '.join(SLO_FIELD)}")
        if self.max_ratio is not None and self.metric == "kv_transfer":
            raise ValueError(f"gate {self.name!r}: the colocated pool has no KV transfer; use max")
        return self


class SetWeight(_Model):
    """Route this percent of each length class to the disaggregated pool."""

    set_weight: StageSpec


class PauseSpec(_Model):
    duration_s: float | None = Field(None, ge=0)  # None: until `invoke rollout.promote`


class Pause(_Model):
    """Wait `duration_s`, or until promoted."""

    pause: PauseSpec


class AnalysisSpec(_Model):
    min_duration_s: float = Field(30.0, gt=0)
    min_samples: int = Field(50, ge=1)  # disaggregated-pool requests of the gated classes in the window
    max_duration_s: float | None = Field(None, gt=0)  # still too few samples by then: inconclusive


class Analysis(_Model):
    """Hold until the gates pass over the minimum duration and samples."""

    analysis: AnalysisSpec = AnalysisSpec()


class ShadowStepSpec(_Model):
    """Shadow `share` percent of `classes` (default: every class the plan's stage moves) for the step:
    the gateways also send those requests to the disaggregated pool and throw the answer away, nobody is
    moved. The step ends as an analysis does, on the shadow series: after `min_duration_s` with
    `min_samples` shadows and every gate (`gates`: names of rollout.gates; default every gate a shadow
    can measure) passed; a failure rolls back; too few shadows by `max_duration_s` is inconclusive."""

    share: int = Field(ge=1, le=100)
    classes: list[LengthClass] | None = Field(None, min_length=1)
    gates: list[str] | None = None
    min_duration_s: float = Field(60.0, gt=0)
    min_samples: int = Field(20, ge=1)  # shadows sent in the window
    max_duration_s: float | None = Field(None, gt=0)  # default 4 x min_duration_s


class Shadow(_Model):
    """Shadow a share of a class to the disaggregated pool and hold the shadows to the gates."""

    shadow: ShadowStepSpec


STEP_KINDS = {"set_weight": SetWeight, "pause": Pause, "analysis": Analysis, "shadow": Shadow}


def _step_kind(value: Any) -> str | None:
    """Which step a mapping is, by its first key that names one (so an error names only that step's
    keys); a parsed step by its class."""
    if isinstance(value, dict):
        return next((kind.__name__ for key, kind in STEP_KINDS.items() if key in value), None)
    return type(value).__name__


Step = Annotated[
    Annotated[SetWeight, Tag("SetWeight")]
    | Annotated[Pause, Tag("Pause")]
    | Annotated[Analysis, Tag("Analysis")]
    | Annotated[Shadow, Tag("Shadow")],
    Discriminator(
        _step_kind,
        custom_error_type="step_kind",
        custom_error_message=f"a step is one of {', '.join(STEP_KINDS)}",
    ),
]


class PlanSpec(_Model):
    """The steps that take traffic from wherever it is to one target stage."""

    steps: list[Step] = Field(min_length=1)


class RolloutSpec(_Model):
    """Controller cadence, Argo's limits, the gates, and one plan per target stage."""

    interval_s: float = Field(1.0, gt=0, le=60)  # how often the controller measures
    window_s: int = Field(30, ge=2, le=3600)  # the window gates measure over
    failure_limit: int = Field(0, ge=-1)  # failed measurements allowed before rollback (-1: never)
    consecutive_error_limit: int = Field(4, ge=0)  # metrics errors in a row before it rolls back
    # outside an analysis step gates still run (Argo's background analysis); a failure counts once the
    # window holds this many disaggregated-pool requests of the gated classes
    min_samples: int = Field(20, ge=1)
    gates: list[GateSpec] = Field(default_factory=list)
    plans: dict[str, PlanSpec] = Field(default_factory=dict)
    # per-pool minimums of every rebalance move, and the automatic mode (issue 35: model.rebalancing)
    rebalance: RebalanceSpec = Field(default_factory=RebalanceSpec)


def weights_of(step: SetWeight | Pause | Analysis | Shadow) -> StageSpec | None:
    """The weights a step sets, if it is a set_weight step."""
    return step.set_weight if isinstance(step, SetWeight) else None


def rollout_problems(spec: RolloutSpec, stages: Mapping[str, StageSpec]) -> Iterator[tuple[str, str]]:
    """(key path, problem) for plans that name no stage, lower a weight, or end off their target."""
    names = [g.name for g in spec.gates]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield f"rollout.gates[{i}].name", f"{name!r} is used by another gate; gate names are unique"
    for target, plan in spec.plans.items():
        where = f"rollout.plans.{target}"
        if target not in stages:
            yield where, f"{target!r} is not a stage in gateway.stages; stages: {', '.join(stages)}"
            continue
        weights = [(i, w) for i, s in enumerate(plan.steps) if (w := weights_of(s)) is not None]
        if not weights:
            yield f"{where}.steps", "has no set_weight step; a plan must end at its stage's weights"
            continue
        for (_, a), (i, b) in zip(weights, weights[1:], strict=False):
            for cls in LENGTH_CLASSES:
                if getattr(b, cls) < getattr(a, cls):
                    yield (
                        f"{where}.steps[{i}].set_weight.{cls}",
                        f"lowers {cls} from {getattr(a, cls)} to {getattr(b, cls)}; a ramp only rises "
                        "(rollback is the controller's job)",
                    )
        for i, step in enumerate(plan.steps):
            if isinstance(step, Shadow):
                yield from shadow_step_problems(
                    step.shadow, f"{where}.steps[{i}].shadow", target, stages, spec
                )
        last_i, last = weights[-1]
        if last != stages[target]:
            yield (
                f"{where}.steps[{last_i}].set_weight",
                f"the last weights {last.model_dump()} differ from gateway.stages.{target} "
                f"{stages[target].model_dump()}; a plan must end at its stage",
            )


def shadow_classes(step: ShadowStepSpec, target: StageSpec) -> list[str]:
    """The classes a shadow step shadows: its own list, or every class the plan's stage moves."""
    if step.classes is not None:
        return list(dict.fromkeys(step.classes))
    return [c for c in LENGTH_CLASSES if getattr(target, c) > 0]


def shadow_gates(step: ShadowStepSpec, gates: list[GateSpec]) -> list[GateSpec]:
    """The gates a shadow step holds: those it names, or every gate a shadow can measure."""
    if step.gates is None:
        return [g for g in gates if g.metric in SHADOW_METRICS]
    return [g for g in gates if g.name in step.gates]


def shadow_step_problems(
    step: ShadowStepSpec, where: str, target: str, stages: Mapping[str, StageSpec], spec: RolloutSpec
) -> Iterator[tuple[str, str]]:
    """A shadow step that shadows a class its stage does not move, or names a gate there is none of
    (or one a shadow cannot measure), or holds no gate at all."""
    weights = stages[target]
    for j, cls in enumerate(step.classes or []):
        if getattr(weights, cls) == 0:
            yield (
                f"{where}.classes[{j}]",
                f"{cls!r}: stage {target} moves 0% of {cls} to P/D; a shadow step shadows what its "
                "stage moves",
            )
    if step.classes is None and not shadow_classes(step, weights):
        yield f"{where}", f"stage {target} moves no class to P/D: nothing to shadow"
    by_name = {g.name: g for g in spec.gates}
    for j, name in enumerate(step.gates or []):
        gate = by_name.get(name)
        if gate is None:
            yield (
                f"{where}.gates[{j}]",
                f"{name!r} is not a gate of rollout.gates ({', '.join(by_name) or 'none'})",
            )
        elif gate.metric not in SHADOW_METRICS:
            yield f"{where}.gates[{j}]", f"{name!r} measures {gate.metric}, which a shadow never has"
    if not shadow_gates(step, spec.gates):
        yield f"{where}.gates", "holds no gate: add one to rollout.gates a shadow can measure"
