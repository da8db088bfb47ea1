"""`invoke provision`: plan every host, show the diffs, apply (unless --check), report."""

from __future__ import annotations

from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli._common import repo_path, setting, user_errors
from pdfleet.cli.options import HELP, deployment_from_options
from pdfleet.errors import ValidationError
from pdfleet.ops.report import print_report
from pdfleet.ops.runner import RunOptions, run_fleet
from pdfleet.provision import plan_host


@task(
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "check": "Plan only: gather facts, print the diffs that would be applied, change nothing.",
        "limit": HELP["limit"],
        "serial": "Apply in waves of N hosts (0: all hosts at once).",
        "roles": HELP["roles"],
        "json": "Also write the JSON report (hosts, changes, totals) to this path.",
    }
)
@user_errors
def provision(ctx: Context, profile: str, inventory: str | None = None, check: bool = False,
              limit: str | None = None, serial: int = 0, roles: str | None = None,
              json: str | None = None) -> None:
    """Converge hosts to the profile: packages, venv, env files, units; 0 changes when converged."""
    if serial < 0:
        raise ValidationError(f"--serial must be 0 (all at once) or a positive wave size, not {serial}")
    deployment = deployment_from_options(ctx, profile, inventory, roles)
    hosts = list(deployment.inventory.limit(limit).hosts.values())
    options = RunOptions(
        check=check,
        serial=serial or None,
        known_hosts=str(Path(setting(ctx, "known_hosts", "~/.ssh/known_hosts")).expanduser()),
        connect_timeout=float(setting(ctx, "connect_timeout", 10)),
        json_path=repo_path(json) if json else None,
    )
    report = run_fleet(hosts, lambda host, facts: plan_host(deployment, host, facts), options)
    print_report(report, check=check)
    if report.totals["failed"]:
        raise Exit(code=1)
