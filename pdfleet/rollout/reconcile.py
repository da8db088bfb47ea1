"""The controller's pure decisions around the state machine: what the gateways' reports mean for the
state (halt, foreign policy, resume, adopt), what a restart finds, whether a version is applied, and
the gate results of a blind tick. The controller (`controller`) does the I/O these decide on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from pdfleet.model.rollout import GateSpec
from pdfleet.rollout.gates import GateResult
from pdfleet.rollout.gateways import GatewayReport
from pdfleet.rollout.machine import ACTIVE, Event, RolloutState


def as_seen_by(state: RolloutState, reports: list[GatewayReport], written: int) -> list[GatewayReport]:
    """The gateways' reports as one model's controller reads them when several models share the
    policy's one version: a version above the model's own but at most `written` (the highest version
    any model's state holds, so one the controller wrote for another model) that still shows this
    model's stage and weights is this model's version: the gateway runs what this model gave it. Any
    other report stands as it is, so a version no model wrote is foreign, and so is this model's stage
    changed behind its back. With one model `written` is its own version: nothing is read otherwise."""
    mine = (state.stage, state.weights)
    return [
        replace(r, version=state.version)
        if state.version < r.version <= written and (r.stage, r.weights) == mine
        else r
        for r in reports
    ]


def lifted(
    state: RolloutState, floor: int, move: Callable[[RolloutState], tuple[RolloutState, list[Event]]]
) -> tuple[RolloutState, list[Event]]:
    """`move` (a step of the state machine, which numbers a new policy version+1) with the new version
    above `floor` (every version any model or gateway holds: the gateways take only a rising version);
    a move that writes nothing new keeps the model's own version."""
    base = state.model_copy(update={"version": max(state.version, floor)})
    new, events = move(base)
    if new.version != base.version or base.version == state.version:
        return new, events
    own = state.version
    events = [{**e, "version": own} if e.get("version") == base.version else e for e in events]
    return new.model_copy(update={"version": own}), events


def peer_pending(state: RolloutState, peers: Sequence[RolloutState]) -> bool:
    """Another model has saved a lower version no gateway has confirmed yet: it is written first, so
    every gateway takes the versions in the order they were saved (a higher one written first would
    refuse the lower one and make its stage look foreign)."""
    return any(p.applied_version < p.version < state.version for p in peers)


def reconcile_reports(
    state: RolloutState, reports: list[GatewayReport], problem: str | None, now: float
) -> tuple[RolloutState, list[Event], bool]:
    """The state after the gateways' reports, its events, and whether the tick ends here (a gateway
    unreachable, a foreign version, or one adopted: nothing else moves this tick)."""
    if problem is not None:
        if state.phase in ACTIVE and state.phase != "halted":
            state = state.model_copy(update={"phase": "halted", "reason": f"halted: {problem}"})
            return state, [{"at": now, "event": "halted", "reason": problem}], True
        return state, [], True
    foreign = [r for r in reports if r.version > state.version]
    if foreign and state.phase in ACTIVE:
        if not state.abort:
            return _halt_foreign(state, foreign[0], now)
        # take what the top gateway runs, so the rollback outranks it everywhere
        top = max(foreign, key=lambda r: r.version)
        state = state.model_copy(update={"version": top.version, "stage": top.stage, "weights": top.weights})
    events: list[Event] = []
    if state.phase == "halted":
        state = state.model_copy(update={"phase": "progressing", "reason": "every gateway answers again"})
        events.append({"at": now, "event": "resumed"})
    if state.phase not in ACTIVE:
        adopted = _adopt(state, reports, now)
        if adopted is not None:
            return adopted[0], adopted[1], True
    return state, events, False


def _halt_foreign(
    state: RolloutState, r: GatewayReport, now: float
) -> tuple[RolloutState, list[Event], bool]:
    if state.phase == "halted" and state.reason.startswith("halted: foreign"):
        return state, [], True
    why = (
        f"foreign policy: gateway {r.name} runs version {r.version} (stage {r.stage}), "
        "not written by the controller (invoke provision --stage?); rollout.abort to go back"
    )
    state = state.model_copy(update={"phase": "halted", "reason": f"halted: {why}"})
    return state, [{"at": now, "event": "halted", "reason": why}], True


def _adopt(
    state: RolloutState, reports: list[GatewayReport], now: float
) -> tuple[RolloutState, list[Event]] | None:
    """With no rollout active: gateways all at one higher version (set by provision) become stable."""
    versions = {(r.version, r.stage, r.weights) for r in reports}
    if len(versions) != 1:
        return None
    version, stage, weights = versions.pop()
    if version <= state.version:
        return None
    reason = f"adopted stage {stage} (version {version}) from the gateways"
    new = state.model_copy(
        update={
            "stage": stage,
            "weights": weights,
            "version": version,
            "applied_version": version,
            "stable_stage": stage,
            "reason": reason,
        }
    )
    return new, [{"at": now, "event": "adopted", "stage": stage, "version": version}]


def may_write(state: RolloutState, reports: list[GatewayReport], problem: str | None) -> bool:
    """Whether the controller may write the saved version to the gateways behind it: every gateway
    answered and none runs a higher version (a write never lowers a gateway's version)."""
    return problem is None and all(r.version <= state.version for r in reports)


def resuming(state: RolloutState, reports: list[GatewayReport], now: float) -> list[Event]:
    """What a (re)started controller finds: a saved version not yet confirmed on every gateway is a
    step it was applying when it stopped; the event names which gateways already run it (writes that
    reached them before the stop) and which it will bring up to it."""
    if state.applied_version >= state.version or not reports:
        return []
    at = [r.name for r in reports if r.version == state.version]
    behind = [r.name for r in reports if r.version < state.version]
    return [
        {
            "at": now,
            "event": "resuming",
            "version": state.version,
            "stage": state.stage,
            "gateways_at_version": at,
            "gateways_behind": behind,
        }
    ]


def confirm(
    state: RolloutState,
    version: int,
    names: Sequence[str],
    written: Sequence[str],
    confirmed: list[GatewayReport],
    problem: str | None,
    now: float,
) -> tuple[RolloutState, list[Event]]:
    """The state after an apply: halted when a gateway did not take the version; the version applied
    once every gateway reports it (recorded with the gateways written this time)."""
    if problem is not None:
        if state.phase in ACTIVE:
            state = state.model_copy(update={"phase": "halted", "reason": f"halted: {problem}"})
        return state, [{"at": now, "event": "halted", "reason": problem, "version": version}]
    if state.version != version or state.applied_version == version:
        return state, []
    if len(confirmed) != len(names) or any(r.version != version for r in confirmed):
        return state, []
    state = state.model_copy(update={"applied_version": version})
    event: Event = {
        "at": now,
        "event": "applied",
        "version": version,
        "stage": state.stage,
        "weights": state.weights.model_dump(),
        "gateways": list(names),
        "written": list(written),
    }
    return state, [event]


def blind_results(gates: Sequence[GateSpec], classes: Sequence[str], why: str) -> list[GateResult]:
    """A metrics error on every gate of every measured class: the tick could not see."""
    return [
        GateResult(g.name, cls, "error", None, None, f"{g.name} ({cls}): metrics error: {why}", g.dry_run)
        for cls in classes
        for g in gates
    ]
