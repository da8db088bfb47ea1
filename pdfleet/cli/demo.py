"""`invoke demo`: the whole toolkit on one machine: lab up, provision lab-cross, show what runs."""

from __future__ import annotations

from invoke import Context, task
from invoke.exceptions import Exit
from rich.console import Console
from rich.table import Table

from pdfleet.cli.exits import user_errors
from pdfleet.cli.lab import LAB_INVENTORY, lab_progress, this_lab
from pdfleet.cli.options import deployment_from_options, run_options, with_host_wheel
from pdfleet.cli.settings import REPO_ROOT, Settings
from pdfleet.fleet.provision import provision
from pdfleet.fleet.status import UnitStatus, fleet_status
from pdfleet.lab.control import up
from pdfleet.ops.report import print_report

DEMO_PROFILE = "lab-cross"


def _status_table(rows: list[UnitStatus]) -> Table:
    table = Table(title=f"units of profile {DEMO_PROFILE}")
    for column in ("host", "unit", "active", "enabled", "/health"):
        table.add_column(column, no_wrap=column in ("host", "unit"))
    for r in rows:
        style = "green" if r.healthy else "red"
        table.add_row(r.host, r.unit, f"[{style}]{r.active}[/]", r.enabled, f"[{style}]{r.health}[/]")
    return table


@task(help={"profile": f"Lab profile to provision (default {DEMO_PROFILE})."})
@user_errors
def demo(ctx: Context, profile: str = DEMO_PROFILE) -> None:
    """Bring the lab up, provision it with a P/D profile, and show every unit's state and health."""
    console = Console(stderr=True)
    up(this_lab(), lab_progress(console))
    deployment, hosts = deployment_from_options(ctx, profile, str(REPO_ROOT / LAB_INVENTORY))
    deployment = with_host_wheel(deployment, lambda msg: console.print(msg, highlight=False))
    report = provision(deployment, hosts, run_options(ctx), console)
    print_report(report)
    rows = fleet_status(deployment, hosts, Settings.of(ctx).known_hosts)
    Console().print(_status_table(rows))
    unhealthy = [r for r in rows if not r.healthy]
    if report.totals["failed"] or unhealthy:
        failed = report.totals["failed"]
        console.print(f"[red]demo: {failed} host(s) failed, {len(unhealthy)} unit(s) unhealthy[/]")
        raise Exit(code=1)
    console.print("[green]demo: every unit active and healthy[/]")
