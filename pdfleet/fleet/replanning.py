"""`invoke rebalance --to-plan FILE`'s executor: the pure replan's moves carried out one at a time, each
followed by a gate hold (the rollout's gate machinery, through the `Gate` the caller passes), and on a gate
failure or a failed move the moves made so far undone in reverse order, so the fleet is back at the layout
before the first move (issue 35).

Each move is the mover's plan from the layout the previous move left, executed by pdfleet.fleet.moving on the
same `Fleet`. The moves back are not gated: they return to a layout the fleet was serving. A move that failed
before its render step changed no layout, but its host was drained: it is admitted again (for a P/D host
the routers are re-rendered without and then with it, since vllm-router 0.1.17 adds no P/D worker over
HTTP and a router whose argv did not change is not restarted). A move that failed at or after its render
step already keeps the new layout, so it is undone like a finished one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pdfleet.fleet.mover import DEFAULT_WAIT_S, Layout, MovePlan, drains_through_router, plan_move
from pdfleet.fleet.moving import ADMIT_ROLES, Clock, Fleet, Front, MoveFailed, MoveReport, Sleep, execute
from pdfleet.fleet.replan import Move

UNCHANGED_STEPS = ("drain", "wait")  # a move failing in these has not changed the layout
UNADMITTED_STEPS = ("render", "health")  # a move failing in these never routed its new pool to the host
UNADMITTED_WAIT_S = 1.0  # the wait of its move back: it holds no request of a pool it never joined


@dataclass(frozen=True)
class Held:
    """A gate hold's outcome: whether the fleet may go on, and why (the gates' reason)."""

    ok: bool
    reason: str


class Gate(Protocol):
    """Holds the fleet to the rollout's gates after a move (the task wires it to Prometheus)."""

    def __call__(self, move: Move, n: int, total: int) -> Held: ...


@dataclass
class PlanReport:
    """What --to-plan did: each finished move's report, the gate holds' reasons, why it stopped (None: it
    reached the plan's layout) and the moves back."""

    moved: list[tuple[Move, MoveReport]] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    stopped: str | None = None
    restored: list[Move] = field(default_factory=list)
    layout: Layout | None = None  # where the fleet is at the end


def moved_events(report: PlanReport, reason: str, **extra: str) -> list[dict[str, Any]]:
    """The live layout's audit line of each move `report` made (the same for --to-plan and a controller's
    proposal): the host, its pools, `reason` and why this host, the drain's figures, the seconds per step
    and its gate hold's outcome ('' when it was not held); `extra` (a proposal's key) in each."""
    return [
        {
            "event": "moved",
            **extra,
            "host": move.host,
            "from": move.source,
            "to": move.target,
            "reason": f"{reason}; {move.why}",
            "at_drain": done.at_drain,
            "outlived": done.outlived,
            "kv_held": done.kv_held,
            "seconds": done.seconds,
            "gates": held,
        }
        for (move, done), held in zip(report.moved, [*report.held, ""], strict=False)
    ]


def apply_moves(
    moves: Sequence[Move],
    before: Layout,
    front: Front,
    fleet: Fleet,
    gate: Gate,
    wait_s: float = DEFAULT_WAIT_S,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> PlanReport:
    """The moves in order, each gated; on a failure, the finished moves undone (MoveFailed only when a
    move back fails: the fleet is then between layouts, and the message says where)."""
    report = PlanReport(layout=before)
    current = before
    done: list[Move] = []
    unadmitted = False  # the last move failed before admitting its host (its move back need not wait)
    for n, move in enumerate(moves, 1):
        fleet.say(f"move {n}/{len(moves)}: {move.host} {move.source} -> {move.target} ({move.why})")
        plan = _planned(current, move, wait_s)
        try:
            report.moved.append((move, execute(plan, current, front, fleet, clock, sleep)))
        except MoveFailed as exc:
            report.stopped = f"move {n} ({move.host} -> {move.target}) failed: {exc}"
            if exc.step in UNCHANGED_STEPS:
                _readmit(current, move, front, fleet)
            else:
                done.append(move)
                current = plan.after
                unadmitted = exc.step in UNADMITTED_STEPS
            break
        done.append(move)
        current = plan.after
        held = gate(move, n, len(moves))
        report.held.append(held.reason)
        if not held.ok:
            report.stopped = f"the gates failed after move {n} ({move.host} -> {move.target}): {held.reason}"
            break
    if report.stopped is not None:
        fleet.say(f"stopping: {report.stopped}; going back to the layout before the first move")
        current = _undo(done, current, front, fleet, wait_s, clock, sleep, report, unadmitted)
    report.layout = current
    return report


def _planned(layout: Layout, move: Move, wait_s: float) -> MovePlan:
    out = plan_move(layout, move.host, move.target, wait_s)
    if not isinstance(out, MovePlan):  # replan checked every move on the same layouts
        raise MoveFailed(f"{move.host} -> {move.target} refused: {out.reason}")
    return out


def _readmit(layout: Layout, move: Move, front: Front, fleet: Fleet) -> None:
    """Route a drained host's pool to it again (the layout names it there still)."""
    fleet.say(f"      {move.host} was drained and not moved: admitting it to the {move.source} pool again")
    if drains_through_router(move.source):
        fleet.converge(layout.drained(move.host), front.admitted, ADMIT_ROLES)
    fleet.converge(layout, front.admitted, ADMIT_ROLES)


def _undo(
    done: Sequence[Move],
    current: Layout,
    front: Front,
    fleet: Fleet,
    wait_s: float,
    clock: Clock,
    sleep: Sleep,
    report: PlanReport,
    unadmitted: bool = False,
) -> Layout:
    """The finished moves undone, last first; the layout at the end. `unadmitted`: the last move failed
    before its host joined its new pool's routing, so its instance there holds no request (and its
    /metrics, if it never started, cannot say so: the move back would wait out --wait for nothing)."""
    for n, move in enumerate(reversed(done), 1):
        back = move.back()
        fleet.say(f"back {n}/{len(done)}: {back.host} {back.source} -> {back.target} ({back.why})")
        plan = _planned(current, back, UNADMITTED_WAIT_S if unadmitted and n == 1 else wait_s)
        try:
            execute(plan, current, front, fleet, clock, sleep)
        except MoveFailed as exc:
            raise MoveFailed(
                f"{report.stopped}; going back, moving {back.host} to {back.target} failed too ({exc}): the "
                f"fleet is at {_pools(current)} and {back.host} is between pools: `invoke rebalance --host "
                f"{back.host} --to {back.target}` or `invoke provision` finishes it"
            ) from exc
        report.restored.append(back)
        current = plan.after
    return current


def _pools(layout: Layout) -> str:
    return "; ".join(
        f"{pool}: {', '.join(layout.members(pool))}" for pool in ("prefill", "decode", "colocated")
    )


def resolve(move: Move, layout: Layout, where: str, front: Front, fleet: Fleet) -> None:
    """Finish what an interrupted move left (pdfleet.fleet.proposed.where_now says `where` its host is in
    the live `layout`): still in its old pool (stopped at drain or wait), it is admitted there again; in its
    new one (the render step was reached), the host and the front are converged to the layout."""
    if where == "source":
        _readmit(layout, move, front, fleet)
        return
    if where == "target":
        fleet.say(f"      {move.host} is in the {move.target} pool in the live layout: finishing its move")
        fleet.converge(layout, (move.host,), None)
    fleet.converge(layout, front.admitted, ADMIT_ROLES)
