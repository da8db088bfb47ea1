"""The operator's commands as edits of the saved state (Argo's CLI patches): submit, abort, promote,
and the read-only views (status, history, a dry-run evaluation). The controller acts on them at its
next tick; a command never talks to a gateway itself."""

from __future__ import annotations

from typing import Any

from pdfleet.errors import PdfleetError, ValidationError
from pdfleet.metrics.source import MetricsError, MetricsSource, SeriesAbsent
from pdfleet.rollout.controller import Controller, finite, time_to_next_step
from pdfleet.rollout.machine import ACTIVE, RolloutState, submit
from pdfleet.rollout.store import Store

DECIDED = "pdfleet_gateway_decisions_total"  # the decider's one reason per routed request


def _saved(store: Store) -> RolloutState:
    state = store.load()
    if state is None:
        raise PdfleetError("the controller has not saved a state yet (is pdfleet-rollout.service running?)")
    return state


def _of(controller: Controller) -> str:
    """`model NAME: ` before a message about one model's rollout (nothing for an unnamed controller)."""
    return f"model {controller.config.name}: " if controller.config.name else ""


def _check_stage(controller: Controller, target: str) -> None:
    stages = controller.config.stages
    if target not in stages:
        raise ValidationError(
            f"--stage: {_of(controller)}{target!r} is not a stage; stages: {', '.join(stages)}"
        )


def submit_rollout(controller: Controller, target: str) -> RolloutState:
    """Start a rollout of the controller's model to `target` (one at a time per model)."""
    config = controller.config
    _check_stage(controller, target)
    with controller.store.locked():
        state = _saved(controller.store)
        now = controller.clock()
        try:
            new = submit(state, target, config.stages, config.rollout, now)
        except ValueError as exc:
            raise ValidationError(f"{_of(controller)}{exc}") from None
        controller.store.save(new)
        controller.store.record(
            [{"at": now, "event": "submitted", "target": target, "stable_stage": new.stable_stage}]
        )
    return new


def flag(controller: Controller, name: str) -> RolloutState:
    """Set `abort`, `promote` or `promote_full` on the active rollout."""
    with controller.store.locked():
        state = _saved(controller.store)
        if state.phase not in ACTIVE:
            what = name.replace("_", " ")
            raise ValidationError(
                f"{_of(controller)}no rollout is active (phase {state.phase}); nothing to {what}"
            )
        new = state.model_copy(update={name: True})
        controller.store.save(new)
        controller.store.record([{"at": controller.clock(), "event": name, "target": state.target}])
    return new


def status(controller: Controller) -> dict[str, Any]:
    """The saved state plus the time to the next step, as JSON-ready data."""
    state = _saved(controller.store)
    doc = state.model_dump()
    doc["weights"] = state.weights.model_dump()
    doc["time_to_next_step_s"] = time_to_next_step(state, controller.config, controller.clock())
    doc["steps"] = (
        len(controller.config.rollout.plans[state.target].steps)
        if state.target in controller.config.rollout.plans
        else 0
    )
    window = controller.config.rollout.window_s
    doc["reason_mix"] = reason_counts(controller.source, window, controller.config.model)
    doc["reason_window_s"] = window
    return doc


def reason_counts(source: MetricsSource, window_s: float, model: str | None) -> dict[str, float] | str:
    """Requests per decider reason over the gates' window (one model's, or every model's), or why there is
    no figure: a gateway that routed nothing yet exports no reason (absent, never a zero)."""
    try:
        got = source.increase(DECIDED, window_s, by=("reason",), match={"model": model} if model else None)
    except SeriesAbsent:
        return "no data: the gateways have decided no request yet"
    except MetricsError as err:
        return f"n/a: {err}"
    return {key[0]: value for key, value in got.items()}


def evaluate(controller: Controller, target: str) -> dict[str, Any]:
    """Dry run: the gates measured now for the classes a rollout to `target` moves; nothing is written."""
    config = controller.config
    _check_stage(controller, target)
    state = _saved(controller.store)
    results, samples = controller.measure(state, moving=config.stages[target])
    return {
        "dry_run": True,
        "target": target,
        "stage": state.stage,
        "version": state.version,
        "samples": samples,
        "results": [
            {
                "gate": r.gate,
                "length_class": r.length_class,
                "outcome": r.outcome,
                "value": finite(r.value),
                "threshold": finite(r.threshold),
                "message": r.message,
            }
            for r in results
        ],
    }
