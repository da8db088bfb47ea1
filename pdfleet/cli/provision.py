"""`invoke provision`: plan every host, show the diffs, apply (unless --check), report."""

from __future__ import annotations

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli import lab_site
from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP, fleet_layouts, live_layout_file, open_deployment, run_options
from pdfleet.errors import ValidationError


@task(
    positional=[],  # `invoke TASK --help` is help, not a profile named --help
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "check": "Plan only: gather facts, print the diffs that would be applied, change nothing.",
        "limit": HELP["limit"],
        "serial": "Apply in waves of N hosts (0: all hosts at once).",
        "roles": HELP["roles"],
        "json": "Also write the JSON report (hosts, changes, totals) to this path.",
        "stage": "Set the gateways to this stage of gateway.stages (an explicit override). Without it the "
        "stage the gateways run now is kept (the rollout controller's); gateway.stage is only "
        "the initial one. With several models, it sets the stage of the model given by --model.",
        "model": "With --stage: the model whose stage it sets (a name under the profile's models:); needed "
        "when the profile serves several (the first one's is the policy's top-level stage).",
        "layout_from_inventory": "Go back to the inventory's pool groups: ignore and, once provision "
        "succeeded, remove the live layout `invoke rebalance` left on the gateway hosts (without it, a moved "
        "host stays moved).",
        "reboot": "Reboot hosts whose roles report 'reboot required' (e.g. a new driver), wave by wave "
        "with --serial, wait for SSH, then converge them. Without it the need is only reported.",
    },
)
@user_errors
def provision(
    ctx: Context,
    profile: str,
    inventory: str | None = None,
    check: bool = False,
    limit: str | None = None,
    serial: int = 0,
    roles: str | None = None,
    json: str | None = None,
    reboot: bool = False,
    stage: str | None = None,
    layout_from_inventory: bool = False,
    model: str | None = None,
) -> None:
    """Converge hosts to the profile: packages, venv, env files, units; 0 changes when converged."""
    from rich.console import Console

    from pdfleet.fleet.provision import provision as run_provision
    from pdfleet.ops.report import print_report

    if serial < 0:
        raise ValidationError(f"--serial must be 0 (all at once) or a positive wave size, not {serial}")
    console = Console(stderr=True)
    deployment = open_deployment(
        ctx,
        profile,
        inventory,
        roles=roles,
        limit=limit,
        stage=stage,
        stage_model=model,
        keys="provision",
        wheel=lambda msg: console.print(msg, highlight=False),
        manifests=True,
        layout_from_inventory=layout_from_inventory,
        fleet_layout=True,
    )
    lab_site.require_routable(deployment.hosts)
    options = run_options(ctx, check=check, serial=serial, json=json, reboot=reboot)
    report = run_provision(deployment, deployment.hosts, options, console)
    print_report(report)
    if report.totals["failed"]:
        raise Exit(code=1)
    if layout_from_inventory and not check:
        reset_layout(ctx, profile, inventory)


def reset_layout(ctx: Context, profile: str, inventory: str | None) -> None:
    """Remove the live layout from the gateway hosts and the local copy (the inventory's layout is now the
    fleet's), recorded in the fleet's audit log."""
    from pdfleet.fleet.live_layout import write_copy

    store = fleet_layouts(ctx, profile, inventory)
    if any(text is not None for text in store.texts().values()):
        store.write(None)
        store.record({"event": "reset", "reason": "invoke provision --layout-from-inventory"})
        print(f"live layout {store.path} removed on the gateway hosts: the fleet runs the inventory's layout")
    write_copy(live_layout_file(ctx, profile, inventory), None)
