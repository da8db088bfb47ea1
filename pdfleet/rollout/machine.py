"""The rollout's state and its pure transitions: one controller tick maps (state, gate results, now) to a
new state plus the audit events, as Argo's controller reconciles a Rollout's status.

The state says which policy the gateways must run (`stage`, `weights`, `version`); the controller
applies it and records `applied_version` only once every gateway reports that version, and a
`set_weight` step counts as done only then. It also says which shadow run the gateways must have
(`shadow`: wanted only while a shadow step progresses, so an end, a pause, a halt or an abort turns
it off; `shadow_live`: the controller may have started one no gateway has confirmed stopped). The
operator's commands are flags on the state
(`abort`, `promote`, `promote_full`), consumed by the next tick.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pdfleet.model.rollout import (
    Analysis,
    Pause,
    PlanSpec,
    RolloutSpec,
    SetWeight,
    Shadow,
    ShadowStepSpec,
    shadow_classes,
)
from pdfleet.model.stages import LENGTH_CLASSES, StageSpec
from pdfleet.rollout.gates import Counters, GateResult, Limits, decide_analysis, decide_tick

Phase = Literal["idle", "progressing", "paused", "inconclusive", "halted", "degraded", "aborted", "succeeded"]
ACTIVE: tuple[str, ...] = ("progressing", "paused", "inconclusive", "halted")
STEP_STAGE_SEP = "@"  # a step's stage in the policy: `long-prompts@2`


class ShadowWant(BaseModel):
    """The shadow run a shadow step wants on every gateway: the target stage's `classes` at `share`
    percent until `until` (Unix seconds: the step's deadline, so a gateway ends it by itself if the
    controller is gone); `key` names this step of this rollout (the gateways' run carries it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    stage: str
    classes: list[str]
    share: int
    until: float


class RolloutState(BaseModel):
    """The live state, as the controller keeps it in its state file (every field has a meaning at rest)."""

    model_config = ConfigDict(extra="forbid")

    phase: Phase = "idle"
    target: str | None = None
    stable_stage: str  # where traffic goes back to: the last stage a rollout completed (or the initial)
    stage: str  # the stage name the gateways run
    weights: StageSpec
    version: int = Field(ge=1)  # the policy version the gateways must report
    applied_version: int = 0  # the version every gateway reported last
    step_index: int = 0
    step_started_at: float = 0.0
    started_at: float = 0.0
    reason: str = ""
    failed_checks: int = 0
    consecutive_errors: int = 0
    abort: bool = False
    promote: bool = False
    promote_full: bool = False
    last_results: list[dict[str, Any]] = Field(default_factory=list)
    shadow: ShadowWant | None = None  # the shadow run the gateways must have (None: none of ours)
    shadow_live: bool = False  # written ahead of a start; cleared once every gateway runs none of ours


@dataclass(frozen=True)
class Tick:
    """What one tick saw: gate results (empty when nothing was measured) and the window's samples."""

    now: float
    results: Sequence[GateResult] = ()
    samples: int = 0


Event = dict[str, Any]


def initial_state(stage: str, weights: StageSpec, version: int) -> RolloutState:
    """No rollout yet: traffic at the given stage, which is also the stable one."""
    return RolloutState(stable_stage=stage, stage=stage, weights=weights, version=version)


def submit(
    state: RolloutState, target: str, stages: Mapping[str, StageSpec], spec: RolloutSpec, now: float
) -> RolloutState:
    """Start a rollout to `target` from the stable stage; refused (ValueError) while one is active."""
    if state.phase in ACTIVE:
        raise ValueError(f"a rollout to {state.target} is {state.phase}; abort it first (rollout.abort)")
    if target not in spec.plans:
        raise ValueError(f"no rollout plan for stage {target!r}; plans: {', '.join(spec.plans) or 'none'}")
    if target == state.stage and state.phase in ("idle", "succeeded"):
        raise ValueError(f"traffic is already at stage {target!r}")
    stable = state.stage if state.phase in ("idle", "succeeded") else state.stable_stage
    if stable not in stages:
        raise ValueError(
            f"traffic is at {stable!r}, not a stage of gateway.stages; set one first "
            "(invoke provision --stage S)"
        )
    return state.model_copy(
        update={
            "phase": "progressing",
            "target": target,
            "stable_stage": stable,
            "step_index": 0,
            "step_started_at": now,
            "started_at": now,
            "reason": f"rollout to {target} submitted",
            "failed_checks": 0,
            "consecutive_errors": 0,
            "abort": False,
            "promote": False,
            "promote_full": False,
            "last_results": [],
        }
    )


def gated_classes(weights: StageSpec, stable: StageSpec) -> list[str]:
    """The length classes the rollout moved (more disaggregated share than the stable stage)."""
    return [c for c in LENGTH_CLASSES if getattr(weights, c) > getattr(stable, c)]


def _moved(state: RolloutState, stage: str, weights: StageSpec) -> dict[str, Any]:
    """The update that points the gateways at another policy (a new version, unless nothing changes)."""
    if stage == state.stage and weights == state.weights:
        return {}
    return {"stage": stage, "weights": weights, "version": state.version + 1}


def home_stage(state: RolloutState, stages: Mapping[str, StageSpec], fallback: str | None) -> str:
    """Where a rollback goes: the stable stage, or (when the profile no longer has it) the fallback
    (the controller's initial stage), or the profile's first stage: always a stage that exists."""
    for name in (state.stable_stage, fallback):
        if name is not None and name in stages:
            return name
    return next(iter(stages))


def _rollback(
    state: RolloutState,
    stages: Mapping[str, StageSpec],
    phase: Phase,
    reason: str,
    now: float,
    fallback: str | None = None,
) -> tuple[RolloutState, list[Event]]:
    stable = home_stage(state, stages, fallback)
    update = {
        "phase": phase,
        "reason": reason,
        "stable_stage": stable,
        "abort": False,
        "promote": False,
        "promote_full": False,
        **_moved(state, stable, stages[stable]),
    }
    new = state.model_copy(update=update)
    return new, [
        {
            "at": now,
            "event": phase,
            "target": state.target,
            "stage": stable,
            "reason": reason,
            "version": new.version,
        }
    ]


def _finish(
    state: RolloutState, stages: Mapping[str, StageSpec], now: float
) -> tuple[RolloutState, list[Event]]:
    target = state.target or state.stage
    update = {
        "phase": "succeeded",
        "stable_stage": target,
        "reason": f"rollout to {target} complete",
        "promote": False,
        "promote_full": False,
        **_moved(state, target, stages[target]),
    }
    new = state.model_copy(update=update)
    return new, [{"at": now, "event": "succeeded", "target": target, "version": new.version}]


def _advance(state: RolloutState, now: float, why: str) -> tuple[RolloutState, list[Event]]:
    new = state.model_copy(
        update={
            "step_index": state.step_index + 1,
            "step_started_at": now,
            "phase": "progressing",
            "reason": why,
            "promote": False,
            "failed_checks": 0,
        }
    )
    return new, [{"at": now, "event": "step", "step": new.step_index, "reason": why}]


def mismatch(state: RolloutState, spec: RolloutSpec, stages: Mapping[str, StageSpec]) -> str | None:
    """Why an active rollout no longer matches the profile (a plan or stage renamed or removed since it
    started), in one line; None when it does."""
    if state.phase not in ACTIVE:
        return None
    if state.target not in spec.plans:
        plans = ", ".join(spec.plans) or "none"
        return f"the profile has no rollout plan {state.target!r} any more (plans: {plans})"
    for what, name in (("target", state.target), ("stable", state.stable_stage)):
        if name not in stages:
            return f"the {what} stage {name!r} is no longer in the profile's gateway.stages"
    return None


def on_mismatch(
    state: RolloutState, stages: Mapping[str, StageSpec], why: str, now: float, fallback: str | None
) -> tuple[RolloutState, list[Event]]:
    """A rollout the profile no longer describes: halted with the reason in one line until the operator
    aborts it; an abort goes back to a stage that exists (see home_stage)."""
    if state.abort:
        return _rollback(
            state, stages, "aborted", f"aborted by the operator (rollout.abort); {why}", now, fallback
        )
    home = home_stage(state, stages, fallback)
    reason = f"halted: {why}; rollout.abort goes back to stage {home}"
    if state.phase == "halted" and state.reason == reason:
        return state, []
    new = state.model_copy(update={"phase": "halted", "reason": reason})
    return new, [{"at": now, "event": "halted", "reason": reason}]


def advance(
    state: RolloutState,
    plan: PlanSpec,
    spec: RolloutSpec,
    stages: Mapping[str, StageSpec],
    tick: Tick,
    fallback: str | None = None,
) -> tuple[RolloutState, list[Event]]:
    """One controller tick of an active rollout (a no-op otherwise). `fallback` is where an abort goes
    when the stable stage is gone from the profile."""
    if state.phase not in ACTIVE or state.target is None:
        return state, []
    now = tick.now
    if state.abort:
        return _rollback(state, stages, "aborted", "aborted by the operator (rollout.abort)", now, fallback)
    events: list[Event] = []
    results = [_result_dict(r) for r in tick.results]
    if results:
        state = state.model_copy(update={"last_results": results})
        events.append(
            {
                "at": now,
                "event": "measurement",
                "step": state.step_index,
                "samples": tick.samples,
                "results": results,
            }
        )
    if state.phase == "halted":
        return state, events  # a gateway did not take the policy: nothing moves until it does
    if state.promote_full:
        new, more = _finish(state, stages, now)
        return new, [*events, {"at": now, "event": "promote_full"}, *more]
    limits = Limits(spec.failure_limit, spec.consecutive_error_limit)
    counters = Counters(state.failed_checks, state.consecutive_errors)
    step = plan.steps[state.step_index] if state.step_index < len(plan.steps) else None
    if tick.results and not isinstance(step, Analysis | Shadow):  # background analysis between them
        verdict = decide_tick(
            tick.results, counters, limits, samples=tick.samples, min_samples=spec.min_samples
        )
        if verdict.verdict in ("failed", "error"):
            new, more = _rollback(state, stages, "degraded", verdict.reason, now, fallback)
            return new, [*events, *more]
        state = state.model_copy(
            update={
                "failed_checks": verdict.counters.failed_checks,
                "consecutive_errors": verdict.counters.consecutive_errors,
            }
        )
        if verdict.counters.consecutive_errors:  # blind: no step moves on until the gates can be read
            return state.model_copy(
                update={"reason": f"holding step {state.step_index}: {verdict.reason}"}
            ), events
    new, more = _step(state, step, spec, stages, tick, limits, fallback)
    return new, [*events, *more]


def _step(
    state: RolloutState,
    step: SetWeight | Pause | Analysis | Shadow | None,
    spec: RolloutSpec,
    stages: Mapping[str, StageSpec],
    tick: Tick,
    limits: Limits,
    fallback: str | None,
) -> tuple[RolloutState, list[Event]]:
    """The current step's own rule: weights applied, a pause over, an analysis decided."""
    now = tick.now
    if step is None:
        return _finish(state, stages, now)
    elapsed = now - state.step_started_at
    if isinstance(step, SetWeight):
        name = f"{state.target}{STEP_STAGE_SEP}{state.step_index}"
        update = _moved(state, name, step.set_weight)
        if update:
            new = state.model_copy(update={**update, "reason": f"applying {step.set_weight.model_dump()}"})
            return new, [
                {
                    "at": now,
                    "event": "set_weight",
                    "step": state.step_index,
                    "weights": step.set_weight.model_dump(),
                    "version": new.version,
                }
            ]
        if state.applied_version < state.version:
            return state, []
        return _advance(state, now, f"weights {step.set_weight.model_dump()} on every gateway")
    if isinstance(step, Pause):
        if state.promote:
            return _advance(state, now, "pause ended by rollout.promote")
        if step.pause.duration_s is not None and elapsed >= step.pause.duration_s:
            return _advance(state, now, f"paused {step.pause.duration_s:g} s")
        reason = (
            "paused until rollout.promote"
            if step.pause.duration_s is None
            else f"paused, {step.pause.duration_s - elapsed:.0f} s left"
        )
        return state.model_copy(update={"phase": "paused", "reason": reason}), []
    if state.phase == "inconclusive":
        if state.promote:
            return _advance(state, now, "inconclusive analysis accepted by rollout.promote")
        return state, []
    a = step.analysis if isinstance(step, Analysis) else step.shadow
    counters = Counters(state.failed_checks, state.consecutive_errors)
    deadline = a.max_duration_s if a.max_duration_s is not None else 4 * a.min_duration_s
    verdict = decide_analysis(
        tick.results,
        counters,
        limits,
        samples=tick.samples,
        min_samples=a.min_samples,
        elapsed_s=elapsed,
        min_duration_s=a.min_duration_s,
        deadline_s=deadline,
    )
    if verdict.verdict in ("failed", "error"):
        return _rollback(state, stages, "degraded", verdict.reason, now, fallback)
    counted = state.model_copy(
        update={
            "failed_checks": verdict.counters.failed_checks,
            "consecutive_errors": verdict.counters.consecutive_errors,
        }
    )
    what = "analysis" if isinstance(step, Analysis) else "shadow"
    if verdict.verdict == "successful":
        return _advance(counted, now, f"{what} of step {state.step_index}: {verdict.reason}")
    if verdict.verdict == "inconclusive":
        new = counted.model_copy(update={"phase": "inconclusive", "reason": verdict.reason})
        return new, [{"at": now, "event": "inconclusive", "step": state.step_index, "reason": verdict.reason}]
    if state.promote:
        return _advance(counted, now, f"{what} skipped by rollout.promote")
    reason = verdict.reason or "analysing"
    reason = reason if isinstance(step, Analysis) else f"shadowing: {reason}"
    return counted.model_copy(update={"phase": "progressing", "reason": reason}), []


def shadow_step(state: RolloutState, spec: RolloutSpec) -> ShadowStepSpec | None:
    """The shadow step the rollout is on, if it is on one (whatever its phase)."""
    plan = spec.plans.get(state.target or "")
    if state.phase not in ACTIVE or plan is None or state.step_index >= len(plan.steps):
        return None
    step = plan.steps[state.step_index]
    return step.shadow if isinstance(step, Shadow) else None


def shadow_wanted(
    state: RolloutState, spec: RolloutSpec, stages: Mapping[str, StageSpec]
) -> ShadowWant | None:
    """The shadow run the gateways must have: a shadow step's, while it progresses (not paused,
    inconclusive, halted, aborted or past its deadline), else none."""
    step = shadow_step(state, spec)
    target = state.target
    if step is None or state.phase != "progressing" or state.abort or target is None or target not in stages:
        return None
    deadline = step.max_duration_s if step.max_duration_s is not None else 4 * step.min_duration_s
    return ShadowWant(
        key=f"{target}:{state.started_at:.3f}:{state.step_index}",
        stage=target,
        classes=shadow_classes(step, stages[target]),
        share=step.share,
        until=state.step_started_at + deadline + spec.interval_s,
    )


def with_shadow(
    state: RolloutState, spec: RolloutSpec, stages: Mapping[str, StageSpec], now: float
) -> tuple[RolloutState, list[Event]]:
    """The state with the shadow run it wants (an event when that changes); wanting one marks it live
    before the controller sends anything (written ahead, as a new version is)."""
    want = shadow_wanted(state, spec, stages)
    if want == state.shadow:
        return state, []
    new = state.model_copy(update={"shadow": want, "shadow_live": state.shadow_live or want is not None})
    if want is None:
        return new, [{"at": now, "event": "shadow_off", "step": state.step_index, "reason": state.reason}]
    event = {"at": now, "event": "shadow_on", "step": state.step_index, **want.model_dump(exclude={"until"})}
    return new, [event]


def _result_dict(r: GateResult) -> dict[str, Any]:
    return {
        "gate": r.gate,
        "length_class": r.length_class,
        "outcome": r.outcome,
        "value": r.value,
        "threshold": r.threshold,
        "message": r.message,
        "dry_run": r.dry_run,
    }
