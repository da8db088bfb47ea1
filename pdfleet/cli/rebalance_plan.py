"""`invoke rebalance --to-plan FILE`: apply `invoke plan`'s recommended layout one host at a time, each move
held to the profile's rollout gates, and on a gate failure stop and go back to the layout before the first
move (issue 35). The moves are pure (pdfleet.fleet.replan), carried out by pdfleet.fleet.replanning on the
same fleet wiring a single move uses (rebalance.TaskFleet), the gates read from the monitoring host's
Prometheus (pdfleet.fleet.gate_hold, the rollout's gates). --dry-run prints the moves and why each host.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, TypeAlias

from invoke import Context

from pdfleet.cli.options import fleet_layouts, layout_note, open_deployment
from pdfleet.cli.settings import Settings, inventory_name, repo_path
from pdfleet.errors import PdfleetError, ValidationError

if TYPE_CHECKING:
    from collections.abc import Callable

    from pdfleet.fleet.deployment import Deployment
    from pdfleet.fleet.gate_hold import GateConfig
    from pdfleet.fleet.mover import Layout
    from pdfleet.fleet.moving import Fleet as MovingFleet
    from pdfleet.fleet.moving import Front
    from pdfleet.fleet.replan import Move
    from pdfleet.fleet.replanning import Held, PlanReport
    from pdfleet.metrics.source import MetricsSource

    # how the task makes the executor's Fleet: (ctx, profile, inventory, layout before, inventory's layout)
    TaskFleetMaker: TypeAlias = Callable[[Context, str, str | None, Layout, Layout], MovingFleet]


class PlanStopped(PdfleetError):
    """--to-plan stopped on a gate or a failed move and went back to the layout before it (exit 1)."""

    exit_code = 1


def read_plan(file: str) -> dict[str, Any]:
    """plan.json's document; ValidationError naming the file when it cannot be read or is not a plan."""
    path = repo_path(file)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValidationError(
            f"--to-plan {file}: no such file (invoke plan writes out/plan-*/plan.json)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValidationError(f"--to-plan {file}: not a plan.json ({exc})") from None
    if not isinstance(doc, dict):
        raise ValidationError(f"--to-plan {file}: not a plan.json (a JSON object from invoke plan)")
    return doc


def to_plan(
    ctx: Context,
    profile: str,
    inventory: str | None,
    file: str,
    wait: int,
    hold_s: float | None,
    reason: str,
    dry_run: bool,
    task_fleet: TaskFleetMaker,
) -> None:
    """Check the plan, compute the moves; print them (--dry-run) or carry them out, gated (on the fleet
    `task_fleet` wires: rebalance.TaskFleet)."""
    from pdfleet.fleet.mover import layout_of
    from pdfleet.fleet.replan import describe, moves_toward, target_of

    doc = read_plan(file)
    # everything the plan and the options can be refused for, before the fleet is read
    local = open_deployment(ctx, profile, inventory)
    if local.profile.models:
        raise ValidationError(
            f"--profile {profile}: lists models; invoke rebalance moves the hosts of a single-model profile"
        )
    config = gate_config(local)
    hold_s = _hold(hold_s, config.rollout.window_s)
    target = target_of(doc, file, _planned_fleet(ctx, local, inventory))
    # a live run starts from the layout the fleet keeps; the dry run from the copy last read from it
    deployment = local if dry_run else open_deployment(ctx, profile, inventory, fleet_layout=True)
    layout = layout_of(deployment.profile.served[0], deployment.inventory)
    initial_deployment = open_deployment(ctx, profile, inventory, layout_from_inventory=True)
    initial = layout_of(initial_deployment.profile.served[0], initial_deployment.inventory)
    moves = moves_toward(layout, target.counts, initial)
    print(layout_note(ctx, profile, inventory, fleet=not dry_run))
    for line in describe(target, moves, layout):
        print(line)
    if dry_run or not moves:
        if moves:
            print(f"(dry run: nothing changes; each move is held to the gates for {hold_s:.0f} s)")
        return
    fleet = task_fleet(ctx, profile, inventory, layout, initial)
    _apply(ctx, profile, inventory, deployment, moves, layout, fleet, config, hold_s, wait, reason, file)


def _hold(given: float | None, window_s: int) -> float:
    """The gate hold after each move: at least the gates' window, so it measures only traffic after it."""
    if given is None:
        return float(window_s)
    if given < window_s:
        raise ValidationError(
            f"--hold {given:g}: must be at least rollout.window_s ({window_s} s), so the gates' window holds "
            "only traffic after the move"
        )
    return given


def _planned_fleet(ctx: Context, deployment: Deployment, inventory: str | None) -> Any:
    from pdfleet.fleet.replan import Fleet

    spec = deployment.profile.served[0]
    gateway = deployment.profile.for_model(spec).gateway
    shapes = {pool: (p.tensor_parallel_size, p.max_num_batched_tokens) for pool, p in spec.pools.items()}
    name = inventory_name(inventory, Settings.of(ctx))
    return Fleet(deployment.profile.name, spec.name, name, shapes, gateway.long_prompt_tokens, gateway.stage)


def gate_config(deployment: Deployment) -> GateConfig:
    """The gates a move is held to: the profile's rollout section, SLO and KV-transfer histogram, as the
    rollout controller's controller.json carries them (roles/rollout)."""
    from pdfleet.fleet.gate_hold import GateConfig
    from pdfleet.monitoring.recording import kv_series

    spec = deployment.profile.served[0]
    kv = kv_series(deployment.profile.for_model(spec))
    slo = spec.slo.model_dump(exclude_none=True)
    return GateConfig(spec.rollout, slo, None if kv is None else (kv.histogram, kv.role))


class PromGate:
    """The replanning executor's Gate on the fleet's Prometheus."""

    def __init__(self, source: MetricsSource, config: GateConfig, hold_s: float) -> None:
        self.source, self.config, self.hold_s = source, config, hold_s

    def __call__(self, move: Move, n: int, total: int) -> Held:
        from pdfleet.fleet.gate_hold import hold
        from pdfleet.fleet.replanning import Held

        print(f"      gates: holding the fleet {self.hold_s:.0f} s after move {n}/{total}", flush=True)
        out = hold(self.source, self.config, self.hold_s, lambda line: print(line, flush=True))
        print(f"      gates: {'passed' if out.ok else 'FAILED'}: {out.reason}", flush=True)
        return Held(out.ok, out.reason)


def prom_gate(deployment: Deployment, config: GateConfig, hold_s: float) -> PromGate:
    """The gate on the monitoring host's Prometheus (ConnectError when the lab cannot route to it)."""
    from urllib.parse import urlparse

    from pdfleet.errors import ConnectError
    from pdfleet.lab.network import lab_route_problem
    from pdfleet.metrics.prometheus import PrometheusClient
    from pdfleet.monitoring.chain_table import prometheus_url

    url = prometheus_url(deployment.topology, None)
    problem = lab_route_problem([urlparse(url).hostname or ""])
    if problem:
        raise ConnectError(problem)
    return PromGate(PrometheusClient(url), config, hold_s)


def front_of(deployment: Deployment) -> Front:
    """The gateway and monitoring hosts a move re-renders."""
    from pdfleet.fleet.moving import Front

    topo = deployment.topology
    return Front(tuple(g.host for g in topo.gateways), tuple(p.host for p in topo.monitoring))


def _apply(
    ctx: Context,
    profile: str,
    inventory: str | None,
    deployment: Deployment,
    moves: list[Move],
    layout: Layout,
    fleet: MovingFleet,
    config: GateConfig,
    hold_s: float,
    wait: int,
    reason: str,
    file: str,
) -> None:
    """The live moves, gated; every move, the stop and the moves back in the fleet's audit log."""
    from pdfleet.fleet.moving import MoveFailed
    from pdfleet.fleet.replanning import apply_moves

    store = fleet_layouts(ctx, profile, inventory)
    if not store.keepers:
        raise ValidationError(
            "the inventory has no gateway host: the live layout is kept on the gateway hosts"
        )
    gate = prom_gate(deployment, config, hold_s)
    front = front_of(deployment)
    why = f"{reason} (--to-plan {file})"
    try:
        report = apply_moves(moves, layout, front, fleet, gate, wait)
    except MoveFailed as exc:
        store.record({"event": "plan-failed", "plan": file, "reason": why, "error": str(exc)})
        raise
    _audit(store, report, why, file)
    if report.stopped is not None:
        raise PlanStopped(
            f"{report.stopped}; back at the layout before the first move "
            f"({len(report.restored)} move(s) undone)"
        )
    print(f"reached the plan's layout in {len(report.moved)} move(s)")


def _audit(store: Any, report: PlanReport, why: str, file: str) -> None:
    from pdfleet.fleet.replanning import moved_events

    for event in moved_events(report, why):
        store.record(event)
    if report.stopped is not None:
        back = [{"host": m.host, "to": m.target} for m in report.restored]
        store.record(
            {"event": "plan-stopped", "plan": file, "reason": why, "why": report.stopped, "back": back}
        )
    else:
        store.record({"event": "plan-reached", "plan": file, "reason": why, "moves": len(report.moved)})
