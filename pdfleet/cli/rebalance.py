"""`invoke rebalance --host H --to POOL [--dry-run]`: move one host between the colocated, prefill and decode
pools without dropping a stream (issue 35), as the pure mover (pdfleet.fleet.mover) plans it from the live
layout and the executor (pdfleet.fleet.moving) carries it out; --dry-run prints the plan and changes nothing.

Here the executor's `Fleet` is wired to the fleet: provisioning hosts under a layout through the one door and
the roles `invoke provision` runs, vllm-router's /remove_worker on each gateway host's loopback over SSH
(the pinned 0.1.17 removes a P/D worker live; it refuses /add_worker in P/D mode, so admitting one
re-renders the router, whose restart drains its streams), and the host's vLLM /metrics and /health.
Every move, refusal and failure is a line of the live layout's audit log, with its reason.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from invoke import Context, task

from pdfleet.cli import lab_site
from pdfleet.cli.exits import user_errors
from pdfleet.cli.monitor import number
from pdfleet.cli.options import (
    HELP,
    fleet_layouts,
    layout_note,
    live_layout_file,
    open_deployment,
    run_options,
)
from pdfleet.cli.settings import Settings, repo_path
from pdfleet.errors import ValidationError
from pdfleet.fleet.mover import DEFAULT_WAIT_S
from pdfleet.model.specs import POOL_NAMES

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.fleet.mover import Layout, Left, MovePlan
    from pdfleet.fleet.topology import Instance

HTTP_TIMEOUT_S = 5.0
DEFAULT_REASON = "by hand (invoke rebalance)"


@task(
    positional=[],  # `invoke TASK --help` is help, not a profile named --help
    auto_shortflags=False,  # -h would read as --help
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "host": "The inventory host to move (it must serve exactly one pool of the profile's model).",
        "to": f"The pool it is to serve: one of {', '.join(POOL_NAMES)}.",
        "wait": f"Seconds the drained host's in-flight requests may run before the move goes on (default "
        f"{DEFAULT_WAIT_S:.0f}).",
        "reason": f"Why the host moves, kept in the audit log with the move (default: {DEFAULT_REASON}).",
        "to_plan": "An `invoke plan` plan.json: move hosts one at a time to its recommended layout's pool "
        "counts, each move held to the profile's rollout gates; a failing gate stops and goes back (instead "
        "of --host/--to).",
        "hold": "With --to-plan: seconds each move is held to the gates (default, and least: "
        "rollout.window_s).",
        "proposed": "Carry out the rollout controller's newest automatic-rebalance proposal (profile's "
        "rollout.rebalance.mode: on), gated and undone on a failing gate as with --to-plan; each proposal is "
        "carried out at most once (instead of --host/--to).",
        "follow": "As --proposed, every this many seconds until Ctrl-C (e.g. --follow 5).",
        "dry_run": "Print the move's steps (--to-plan: the moves and why each host), the layout after it and "
        "the hosts it provisions; change nothing.",
    },
)
@user_errors
def rebalance(
    ctx: Context,
    profile: str,
    host: str | None = None,
    to: str | None = None,
    inventory: str | None = None,
    wait: int = int(DEFAULT_WAIT_S),
    reason: str = DEFAULT_REASON,
    to_plan: str | None = None,
    hold: str | None = None,
    proposed: bool = False,
    follow: str | None = None,
    dry_run: bool = False,
) -> None:
    """Move a host between the colocated, prefill and decode pools, or hosts to a plan's layout (--to-plan);
    --dry-run: plan it, change nothing."""
    from pdfleet.cli.rebalance_plan import to_plan as apply_plan
    from pdfleet.fleet.mover import MovePlan, layout_of, plan_move

    if wait <= 0:
        raise ValidationError(f"--wait must be a positive number of seconds, not {wait}")
    if not reason.strip():
        raise ValidationError("--reason must say why the host moves (it goes into the audit log)")
    if proposed or follow is not None:
        _proposed(ctx, profile, inventory, host, to, to_plan, wait, hold, follow, dry_run)
        return
    if to_plan is not None:
        if host is not None or to is not None:
            raise ValidationError("give --host H --to POOL, or --to-plan FILE, not both")
        hold_s = None if hold is None else number("--hold", hold, most=3600.0)
        apply_plan(ctx, profile, inventory, to_plan, wait, hold_s, reason, dry_run, TaskFleet)
        return
    if host is None or to is None:
        raise ValidationError("give --host H --to POOL (one move), or --to-plan FILE (a plan's layout)")
    if hold is not None:
        raise ValidationError("--hold applies to --to-plan only (a single move is not gated)")
    # a live move starts from the layout the fleet keeps; the dry run from the copy last read from it
    deployment = open_deployment(ctx, profile, inventory, fleet_layout=not dry_run)
    if deployment.profile.models:
        raise ValidationError(
            f"--profile {profile}: lists models; invoke rebalance moves the hosts of a single-model profile"
        )
    layout = layout_of(deployment.profile.served[0], deployment.inventory)
    print(layout_note(ctx, profile, inventory, fleet=not dry_run))
    out = plan_move(layout, host, to, wait)
    if not isinstance(out, MovePlan):
        if not dry_run:
            event = {"event": "refused", "host": host, "to": to, "why": out.reason, "reason": reason}
            fleet_layouts(ctx, profile, inventory).record(event)
        raise ValidationError(f"--host {host} --to {to}: refused: {out.reason}")
    if dry_run:
        for line in describe(out, deployment):
            print(line)
        return
    move(ctx, profile, inventory, deployment, out, layout, reason)


def _proposed(
    ctx: Context,
    profile: str,
    inventory: str | None,
    host: str | None,
    to: str | None,
    to_plan: str | None,
    wait: int,
    hold: str | None,
    follow: str | None,
    dry_run: bool,
) -> None:
    """--proposed / --follow S: the controller's proposals, carried out from here (rebalance_proposed)."""
    from pdfleet.cli.rebalance_proposed import follow as follow_proposals

    if host is not None or to is not None or to_plan is not None:
        raise ValidationError(
            "--proposed/--follow carry out the controller's proposals: not with --host/--to/--to-plan"
        )
    if dry_run:
        raise ValidationError(
            "--proposed/--follow move hosts; the controller's dry run is rollout.rebalance.mode: dry-run"
        )
    every = None if follow is None else number("--follow", follow, most=3600.0)
    if every is not None and every <= 0:
        raise ValidationError(f"--follow must be a positive number of seconds, not {follow}")
    hold_s = None if hold is None else number("--hold", hold, most=3600.0)
    follow_proposals(ctx, profile, inventory, wait, hold_s, every, TaskFleet)


def move(
    ctx: Context,
    profile: str,
    inventory: str | None,
    deployment: Deployment,
    plan: MovePlan,
    before: Layout,
    reason: str,
) -> None:
    """The live move: the executor's steps on the fleet, the outcome in the fleet's audit log either way."""
    from pdfleet.fleet.mover import layout_of
    from pdfleet.fleet.moving import Front, MoveFailed, execute

    store = fleet_layouts(ctx, profile, inventory)
    if not store.keepers:
        raise ValidationError(
            "the inventory has no gateway host: the live layout is kept on the gateway hosts, beside the "
            "live stage, so a host cannot move"
        )
    initial = open_deployment(ctx, profile, inventory, layout_from_inventory=True)
    fleet = TaskFleet(
        ctx, profile, inventory, before, layout_of(initial.profile.served[0], initial.inventory)
    )
    topo = deployment.topology
    front = Front(tuple(g.host for g in topo.gateways), tuple(p.host for p in topo.monitoring))
    event = {"host": plan.host, "from": plan.source, "to": plan.target, "reason": reason}
    print(f"rebalance {plan.host}: {plan.source} -> {plan.target} ({reason})")
    try:
        report = execute(plan, before, front, fleet)
    except MoveFailed as exc:
        store.record({"event": "move-failed", **event, "error": str(exc)})
        raise
    done = {
        "at_drain": report.at_drain,
        "outlived": report.outlived,
        "kv_held": report.kv_held,
        "seconds": report.seconds,
    }
    store.record({"event": "moved", **event, **done})
    print(f"moved {plan.host} to the {plan.target} pool in {sum(report.seconds.values()):.1f} s")


class TaskFleet:
    """The executor's Fleet on a real fleet (see the module docstring). `before`: the layout the move
    starts from (where the host's instances are looked up); `initial`: the inventory's layout."""

    def __init__(
        self, ctx: Context, profile: str, inventory: str | None, before: Layout, initial: Layout
    ) -> None:
        from rich.console import Console

        self.ctx, self.profile, self.inventory = ctx, profile, inventory
        self.before, self.initial = before, initial
        self.console = Console(stderr=True)
        self.store = fleet_layouts(ctx, profile, inventory)

    def converge(self, layout: Layout, hosts: Sequence[str], roles: str | None) -> None:
        from pdfleet.fleet.moving import MoveFailed
        from pdfleet.fleet.provision import provision as run_provision

        deployment = open_deployment(
            self.ctx,
            self.profile,
            self.inventory,
            roles=roles,
            limit=",".join(hosts),
            keys="provision",
            wheel=lambda msg: self.console.print(msg, highlight=False),
            manifests=True,
            layout=layout.hosts,
        )
        lab_site.require_routable(deployment.hosts)
        report = run_provision(deployment, deployment.hosts, run_options(self.ctx), self.console)
        if report.totals["failed"]:
            errors = "; ".join(f"{name}: {h.error}" for name, h in report.hosts.items() if h.error)
            raise MoveFailed(f"provisioning {', '.join(hosts)} failed: {errors}")
        self.say(f"      {', '.join(hosts)}: {report.totals['changed']} change(s)")

    def _where(self, host: str, pool: str) -> Deployment:
        """The deployment where `host` serves `pool` (its instance's address, port and routers)."""
        return open_deployment(
            self.ctx, self.profile, self.inventory, layout=self.before.with_move(host, pool).hosts
        )

    def _instance(self, host: str, pool: str) -> Instance:
        return next(i for i in self._where(host, pool).topology.on_host(host) if i.pool == pool)

    def unroute(self, host: str, pool: str) -> None:
        from pdfleet.fleet.moving import MoveFailed
        from pdfleet.ops.ssh import open_connection

        deployment = self._where(host, pool)
        inst = next(i for i in deployment.topology.on_host(host) if i.pool == pool)
        settings = Settings.of(self.ctx)
        for router in deployment.topology.model().routers:
            gateway = deployment.inventory.hosts[router.host]
            lab_site.require_routable([gateway])
            conn = open_connection(gateway, settings.known_hosts, settings.connect_timeout)
            try:
                removed = conn.run(
                    f"curl -sS -f -X POST '{router.url}/remove_worker?url={quote(inst.url, safe='')}'",
                    timeout=30,
                )
                listed = conn.run(f"curl -sS -f '{router.url}/list_workers'", timeout=30)
            finally:
                conn.close()
            urls = json.loads(listed.stdout or "{}").get("urls", []) if listed.rc == 0 else None
            if removed.rc != 0 or urls is None or inst.url in urls:
                raise MoveFailed(
                    f"{router.host}: vllm-router did not remove {inst.url} "
                    f"({(removed.stderr or listed.stderr).strip() or urls})"
                )
            self.say(f"      {router.host}: vllm-router no longer selects {inst.url}")

    def left(self, host: str, pool: str) -> Left | None:
        from pdfleet.fleet.mover import left_in
        from pdfleet.metrics.scrape import scrape_metrics

        try:
            return left_in(pool, scrape_metrics(self._instance(host, pool).url))
        except (OSError, ValueError):
            return None

    def healthy(self, host: str, pool: str) -> bool:
        try:
            with urllib.request.urlopen(self._instance(host, pool).health_url, timeout=HTTP_TIMEOUT_S) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def keep(self, layout: Layout) -> None:
        from pdfleet.fleet.live_layout import layout_text, write_copy
        from pdfleet.fleet.mover import keeps_live_layout

        keepers = ", ".join(h.name for h in self.store.keepers)
        text = None
        if keeps_live_layout(layout, self.initial):
            text = layout_text(self.profile, self.inventory_path, layout.hosts)
            self.say(f"      live layout kept in {self.store.path} on {keepers}")
        else:
            self.say(f"      the inventory's layout again: {self.store.path} removed on {keepers}")
        self.store.write(text)
        write_copy(live_layout_file(self.ctx, self.profile, self.inventory), text)

    @property
    def inventory_path(self) -> Path:
        settings = Settings.of(self.ctx)
        return repo_path(self.inventory) if self.inventory else settings.inventory

    def say(self, line: str) -> None:
        print(line, flush=True)


def describe(plan: MovePlan, deployment: Deployment) -> list[str]:
    """The dry run's lines: the move, its steps, the layout after it and the hosts it provisions."""
    lines = [f"rebalance {plan.host}: {plan.source} -> {plan.target} (dry run: nothing changes)"]
    for n, step in enumerate(plan.steps, 1):
        bound = f" (at most {step.bound_s:.0f} s)" if step.bound_s is not None else ""
        lines.append(f"  {n}. {step.kind}: {step.detail}{bound}")
    lines.append("layout after the move:")
    lines.extend(f"  {pool}: {', '.join(hosts) or '(none)'}" for pool, hosts in _pools(plan.after).items())
    topo = deployment.topology
    others = [g.host for g in topo.gateways] + [p.host for p in topo.monitoring]
    provisioned = [plan.host, *dict.fromkeys(h for h in others if h != plan.host)]
    lines.append(
        f"provisions: {', '.join(provisioned)} (the host's units; gateway, router, Prometheus targets)"
    )
    return lines


def _pools(layout: Layout) -> dict[str, list[str]]:
    """Each pool the layout has and its hosts, in prefill, decode, colocated order."""
    from pdfleet.model.specs import POOL_NAMES

    return {pool: layout.members(pool) for pool in POOL_NAMES if pool in layout.pool_gpus}
