"""`invoke rebalance --proposed` (one look) and `--follow` (a loop): carry out the rollout controller's
automatic rebalance proposals (`rollout.rebalance.mode: on`) from the control machine, which holds the SSH
keys the controller on the monitoring host does not (issue 35).

Each look reads the controller's audit log (`pdfleet-rollout history` on the monitoring host, as
`invoke rollout.history` does) and the live layout and its audit log on the gateway hosts, asks the pure
pdfleet.fleet.proposed what to do, and does it: the newest proposal's move, gated and undone on a failing
gate as `--to-plan`'s moves are (pdfleet.fleet.replanning on rebalance.TaskFleet), an interrupted one
resolved, a stale one skipped; every step a line of the live layout's audit log naming the proposal.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from invoke import Context

from pdfleet.cli.options import fleet_layouts, open_deployment

if TYPE_CHECKING:
    from pdfleet.cli.rebalance_plan import TaskFleetMaker
    from pdfleet.fleet.proposed import Action

HISTORY_LAST = 200  # the controller's audit lines read each look (proposals are a few an hour at most)


def follow(
    ctx: Context,
    profile: str,
    inventory: str | None,
    wait: int,
    hold_s: float | None,
    every_s: float | None,
    task_fleet: TaskFleetMaker,
) -> None:
    """One look (`every_s` None) or a look every `every_s` seconds until Ctrl-C."""
    from pdfleet.errors import ValidationError

    deployment = open_deployment(ctx, profile, inventory)  # bad input refused before a host is contacted
    if deployment.profile.models:
        raise ValidationError(
            f"--profile {profile}: lists models; invoke rebalance moves the hosts of a single-model profile"
        )
    spec = deployment.profile.served[0].rollout.rebalance
    if spec.mode != "on":
        raise ValidationError(
            f"--profile {profile}: rollout.rebalance.mode is {spec.mode}: the controller proposes moves to "
            "carry out only with mode: on"
        )
    if every_s is None:
        look(ctx, profile, inventory, wait, hold_s, task_fleet, quiet=False)
        return
    print(f"following the controller's proposals every {every_s:g} s (Ctrl-C stops)", flush=True)
    try:
        while True:
            look(ctx, profile, inventory, wait, hold_s, task_fleet, quiet=True)
            time.sleep(every_s)
    except KeyboardInterrupt:
        print("stopped following", flush=True)


def look(
    ctx: Context,
    profile: str,
    inventory: str | None,
    wait: int,
    hold_s: float | None,
    task_fleet: TaskFleetMaker,
    quiet: bool,
) -> Action:
    """Read the proposals and the live layout, decide, act."""
    from pdfleet.cli.rebalance_plan import gate_config
    from pdfleet.fleet.mover import layout_of
    from pdfleet.fleet.proposed import audit_events, next_action, proposals_in

    deployment = open_deployment(ctx, profile, inventory, fleet_layout=True)
    layout = layout_of(deployment.profile.served[0], deployment.inventory)
    first = open_deployment(ctx, profile, inventory, layout_from_inventory=True)
    initial = layout_of(first.profile.served[0], first.inventory)
    store = fleet_layouts(ctx, profile, inventory)
    spec = deployment.profile.served[0].rollout.rebalance
    history = _controller_history(ctx, profile, inventory)
    audit = audit_events(store.audit().values())
    action = next_action(proposals_in(history), audit, layout, initial, time.time(), spec.act_within_s)
    if action.kind == "none":
        if not quiet:
            print(action.why, flush=True)
        return action
    key = action.key
    if action.kind == "skip":
        print(f"proposal {key}: skipped: {action.why}", flush=True)
        store.record({"event": "proposal-skipped", "proposal": key, "why": action.why})
        return action
    config = gate_config(deployment)
    hold = max(hold_s or 0.0, float(config.rollout.window_s))
    fleet = task_fleet(ctx, profile, inventory, layout, initial)
    if action.kind == "resolve":
        _resolve(action, layout, deployment, fleet, store)
    else:
        _carry(action, layout, deployment, fleet, store, config, hold, wait)
    return action


def _controller_history(ctx: Context, profile: str, inventory: str | None) -> list[dict[str, Any]]:
    from pdfleet.cli.rollout import _remote

    _, run = _remote(ctx, profile, inventory)
    lines = run(["history", "--last", str(HISTORY_LAST)]).splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _resolve(action: Action, layout: Any, deployment: Any, fleet: Any, store: Any) -> None:
    from pdfleet.cli.rebalance_plan import front_of
    from pdfleet.fleet.proposed import where_now
    from pdfleet.fleet.replanning import resolve

    move = action.move
    assert move is not None
    key = action.key
    where = where_now(layout, move)
    print(f"proposal {key}: {action.why}: {move.host} is in its {where} pool; resolving", flush=True)
    resolve(move, layout, where, front_of(deployment), fleet)
    store.record({"event": "proposal-resolved", "proposal": key, "host": move.host, "where": where})
    print(f"proposal {key}: resolved ({move.host} serves {', '.join(layout.hosts.get(move.host, ()))})")


def _carry(
    action: Action,
    layout: Any,
    deployment: Any,
    fleet: Any,
    store: Any,
    config: Any,
    hold_s: float,
    wait: int,
) -> None:
    from pdfleet.cli.rebalance_plan import front_of, prom_gate
    from pdfleet.fleet.moving import MoveFailed
    from pdfleet.fleet.proposed import taken_event
    from pdfleet.fleet.replanning import apply_moves

    assert action.proposal is not None and action.move is not None
    key, move = action.key, action.move
    gate = prom_gate(deployment, config, hold_s)
    front = front_of(deployment)
    print(f"proposal {key}: {move.source} -> {move.target}, {action.why}; moving {move.host}", flush=True)
    store.record(taken_event(action))
    try:
        report = apply_moves([move], layout, front, fleet, gate, wait)
    except MoveFailed as exc:
        store.record({"event": "proposal-failed", "proposal": key, "error": str(exc)})
        raise
    why = f"the controller's proposal {key}: {action.proposal.why}"
    for (m, done), held in zip(report.moved, [*report.held, ""], strict=False):
        event = {"event": "moved", "proposal": key, "host": m.host, "from": m.source, "to": m.target}
        store.record(
            {
                **event,
                "reason": f"{why}; {m.why}",
                "at_drain": done.at_drain,
                "outlived": done.outlived,
                "kv_held": done.kv_held,
                "seconds": done.seconds,
                "gates": held,
            }
        )
    if report.stopped is not None:
        back = [{"host": m.host, "to": m.target} for m in report.restored]
        store.record({"event": "proposal-stopped", "proposal": key, "why": report.stopped, "back": back})
        print(f"proposal {key}: stopped and went back: {report.stopped}", flush=True)
        return
    print(f"proposal {key}: moved {move.host} to the {move.target} pool", flush=True)
