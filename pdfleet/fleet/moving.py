"""The rebalance executor: the pure mover's steps (pdfleet.fleet.mover) carried out on a fleet, in order,
each shown as it starts and ends (issue 35).

What each step does is decided here from the plan alone; how it touches the fleet (provisioning hosts under
a layout with the same roles `invoke provision` runs, vllm-router's /remove_worker, a vLLM instance's
/metrics and /health) is the `Fleet` the caller passes, so this module holds the order, the bounds and
what is reported, and no I/O of its own:

1. drain: a host leaving a P/D pool is removed from every gateway's router with the router's own worker
   management (its streams in flight keep their worker); a colocated host leaves the gateway's policy by
   provisioning the gateway hosts under the layout where it serves nothing (a reload: streams kept).
2. wait: its in-flight requests (running and waiting, from its /metrics) until none is left or the bound,
   and for a prefill host, until no decode still reads its KV (mover.left_in); what outlives the bound is
   reported, and is cut when its old unit is retired.
3. render: the live layout is kept first (a plain provision from now on converges to the new layout),
   then the host is provisioned under it: its old unit retired, its new one installed and started.
4. health: its new instance answers /health.
5. admit: the gateway and monitoring hosts are provisioned under the new layout: the gateway's policy
   (reload), the router's instances (a restart: vllm-router drains its streams on SIGTERM; the gateway
   falls back to the colocated pool meanwhile) and Prometheus's targets with their new labels (reload).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdfleet.errors import PdfleetError
from pdfleet.fleet.mover import Layout, Left, MovePlan, Step, drains_through_router

POLL_S = 0.5  # how often the wait and the health step look again
SETTLE_S = 1.0  # a request the gateway or router sent just before the drain reaches the host in this time
HEALTH_S = 120.0  # the health step's bound (provisioning already waited for /health)
FRONT_ROLES = "gateway"  # what a colocated drain re-renders on the gateway hosts: the policy
ADMIT_ROLES = "gateway,monitoring"  # what admitting re-renders: policy, routers, Prometheus targets


class MoveFailed(PdfleetError):
    """A step of a move failed: the fleet is where the steps before it left it (exit 1); `step` names
    the step ("" where no step of a move raised it)."""

    exit_code = 1

    def __init__(self, message: str, step: str = "") -> None:
        super().__init__(message)
        self.step = step


class Fleet(Protocol):
    """How the executor touches the fleet (the task wires it to provisioning, SSH and HTTP)."""

    def converge(self, layout: Layout, hosts: Sequence[str], roles: str | None) -> None:
        """Provision `hosts` under `layout` with `roles` (None: all); raise MoveFailed if a host failed."""
        ...

    def unroute(self, host: str, pool: str) -> None:
        """Remove the host's `pool` instance from every gateway's vllm-router (its /remove_worker)."""
        ...

    def left(self, host: str, pool: str) -> Left | None:
        """What the host's `pool` instance still holds (mover.left_in; None: its /metrics cannot be read)."""
        ...

    def healthy(self, host: str, pool: str) -> bool:
        """Whether the host's `pool` instance answers /health."""
        ...

    def keep(self, layout: Layout) -> None:
        """Keep `layout` as the live layout (or, when it is the inventory's, remove the live layout)."""
        ...

    def say(self, line: str) -> None:
        """Show one progress line."""
        ...


@dataclass(frozen=True)
class Front:
    """The hosts in front of the pools: the gateway hosts (policy, routers) and the monitoring hosts."""

    gateways: tuple[str, ...]
    monitoring: tuple[str, ...]

    @property
    def admitted(self) -> list[str]:
        """The hosts admitting re-renders, each once, gateways first."""
        return list(dict.fromkeys((*self.gateways, *self.monitoring)))


@dataclass
class MoveReport:
    """What a move did: each step's seconds, the requests in the host as it was drained and those that
    outlived the wait (None: unread), and whether a prefill host still held KV for a decode at its end."""

    seconds: dict[str, float] = field(default_factory=dict)
    at_drain: int | None = 0
    outlived: int | None = 0
    kv_held: bool = False


Clock = Callable[[], float]
Sleep = Callable[[float], None]


def execute(
    plan: MovePlan,
    before: Layout,
    front: Front,
    fleet: Fleet,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> MoveReport:
    """Carry out a move's steps in order; a failing step raises MoveFailed naming it (the steps after it
    are not run)."""
    report = MoveReport()
    for n, step in enumerate(plan.steps, 1):
        fleet.say(f"[{n}/{len(plan.steps)}] {step.kind}: {step.detail}")
        started = clock()
        try:
            _run(step, plan, before, front, fleet, report, clock, sleep)
        except MoveFailed as exc:
            raise MoveFailed(f"{step.kind}: {exc}", step.kind) from exc
        took = clock() - started
        report.seconds[step.kind] = round(took, 1)
        fleet.say(f"      {step.kind} done in {took:.1f} s")
    return report


def _run(
    step: Step,
    plan: MovePlan,
    before: Layout,
    front: Front,
    fleet: Fleet,
    report: MoveReport,
    clock: Clock,
    sleep: Sleep,
) -> None:
    """One step (see the module docstring)."""
    if step.kind == "drain":
        if drains_through_router(step.pool):
            fleet.unroute(step.host, step.pool)
        else:
            fleet.converge(before.drained(step.host), front.gateways, FRONT_ROLES)
    elif step.kind == "wait":
        first = fleet.left(step.host, step.pool)
        report.at_drain = None if first is None else first.requests
        shown = "an unknown number of" if report.at_drain is None else str(report.at_drain)
        fleet.say(f"      {shown} request(s) in {step.host} at the drain")
        sleep(SETTLE_S)
        last = wait_out(fleet, step, clock, sleep)
        report.outlived = None if last is None else last.requests
        report.kv_held = last is not None and last.kv_held
        if report.outlived:
            fleet.say(
                f"      {report.outlived} request(s) still in {step.host} after {step.bound_s:.0f} s: "
                "they are cut when its old unit is retired"
            )
        elif report.kv_held:
            fleet.say(
                f"      {step.host} still holds KV for a decode's read after {step.bound_s:.0f} s: "
                "a read in flight fails when its old unit is retired (vLLM's decode recomputes or fails it)"
            )
        elif report.outlived is None:
            fleet.say(f"      {step.host}'s /metrics could not be read: going on without knowing")
    elif step.kind == "render":
        fleet.keep(plan.after)
        fleet.converge(plan.after, (step.host,), None)
    elif step.kind == "health":
        if not _poll(lambda: fleet.healthy(step.host, step.pool), HEALTH_S, clock, sleep):
            raise MoveFailed(f"{step.host}'s {step.pool} instance did not answer /health in {HEALTH_S:.0f} s")
    else:
        fleet.converge(plan.after, front.admitted, ADMIT_ROLES)


def wait_out(fleet: Fleet, step: Step, clock: Clock, sleep: Sleep) -> Left | None:
    """Wait until the host holds nothing (no request, no KV a decode may read) or the step's bound passed:
    what is left, or None when its /metrics could not be read at the end."""
    bound = step.bound_s or 0.0
    deadline = clock() + bound
    while True:
        left = fleet.left(step.host, step.pool)
        if (left is not None and left.done) or clock() >= deadline:
            return left
        sleep(POLL_S)


def _poll(check: Callable[[], bool], bound: float, clock: Clock, sleep: Sleep) -> bool:
    """Whether `check` came true within `bound` seconds."""
    deadline = clock() + bound
    while not check():
        if clock() >= deadline:
            return False
        sleep(POLL_S)
    return True
