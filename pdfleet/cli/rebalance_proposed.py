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
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from invoke import Context

from pdfleet.cli.options import fleet_layouts, open_deployment
from pdfleet.fleet.layout_store import FollowerLock

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
    lock = FollowerLock(fleet_layouts(ctx, profile, inventory), follower_name()).take()
    try:
        if every_s is None:
            look(ctx, profile, inventory, wait, hold_s, task_fleet, quiet=False)
            return

        def each() -> None:
            if not lock.alive:  # its connection was lost: taken again, or refused if another took it
                lock.take()
            look(ctx, profile, inventory, wait, hold_s, task_fleet, quiet=True)

        print(f"following the controller's proposals every {every_s:g} s (Ctrl-C stops)", flush=True)
        try:
            follow_loop(each, every_s)
        except KeyboardInterrupt:
            print("stopped following", flush=True)
    finally:
        lock.release()


def follower_name() -> str:
    """Who follows, as a refused second follower is told: this machine, process and start time."""
    return f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%H:%M:%S UTC', time.gmtime())}"


def transient() -> tuple[type[BaseException], ...]:
    """The errors a look may fail on and the next look may not: a host or Prometheus not answering."""
    from paramiko import SSHException

    from pdfleet.errors import ConnectError
    from pdfleet.metrics.source import MetricsUnavailable

    return (ConnectError, MetricsUnavailable, OSError, EOFError, SSHException)


def follow_loop(
    each: Callable[[], object],
    every_s: float,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> None:
    """`each` look every `every_s` seconds; one failing on a transient error is reported and looked again
    after a pause (pdfleet.fleet.proposed.retry_pause), until FOLLOW_FAILURES in a row stop it (ConnectError
    naming the last). Any other error stops it at once (a move back that failed, bad state)."""
    from pdfleet.errors import ConnectError
    from pdfleet.fleet.proposed import FOLLOW_FAILURES, retry_pause

    failures = 0
    while True:
        try:
            each()
        except transient() as exc:
            failures += 1
            pause = retry_pause(failures, every_s)
            if pause is None:
                raise ConnectError(
                    f"--follow stopped: {failures} looks in a row failed, the last on: {exc}. A move such a "
                    "look interrupted is resolved by the next look (invoke rebalance --proposed)"
                ) from None
            limit = f"{failures} in a row, --follow stops at {FOLLOW_FAILURES}"
            say(f"look failed ({limit}): {exc}; next look in {pause:g} s")
        else:
            failures, pause = 0, every_s
        sleep(pause)


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
    from pdfleet.fleet.replanning import apply_moves, moved_events

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
    for event in moved_events(
        report, f"the controller's proposal {key}: {action.proposal.why}", proposal=key
    ):
        store.record(event)
    if report.stopped is not None:
        back = [{"host": m.host, "to": m.target} for m in report.restored]
        store.record({"event": "proposal-stopped", "proposal": key, "why": report.stopped, "back": back})
        print(f"proposal {key}: stopped and went back: {report.stopped}", flush=True)
        return
    print(f"proposal {key}: moved {move.host} to the {move.target} pool", flush=True)
