"""`invoke demo`: the whole toolkit on one machine: lab up, provision lab-cross, show what runs, then a short
bench of the long-prompt mix (colocated vs P/D) ending with its short-streams table (how many short streams
decoded beside a long prefill on their own instance, their stalls), the headline table and the verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli.bench import print_outcome, run_bench
from pdfleet.cli.exits import user_errors
from pdfleet.cli.lab import LAB_INVENTORY, lab_progress, this_lab
from pdfleet.cli.options import open_deployment, run_options
from pdfleet.cli.settings import REPO_ROOT, Settings

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from rich.console import Console
    from rich.table import Table

    from pdfleet.fleet.status import UnitStatus

DEMO_PROFILE = "lab-cross"
BENCH_SECONDS = 25  # per pool: with warm-up and drain, about a minute for both


def _status_table(rows: list[UnitStatus]) -> Table:
    from rich.table import Table

    table = Table(title=f"units of profile {DEMO_PROFILE}")
    for column in ("host", "unit", "active", "enabled", "/health"):
        table.add_column(column, no_wrap=column in ("host", "unit"))
    for r in rows:
        style = "green" if r.healthy else "red"
        table.add_row(r.host, r.unit, f"[{style}]{r.active}[/]", r.enabled, f"[{style}]{r.health}[/]")
    return table


@task(
    help={
        "profile": f"Lab profile to provision (default {DEMO_PROFILE}).",
        "bench_seconds": f"Seconds of long-prompt-mix load per pool in the closing bench (default "
        f"{BENCH_SECONDS}; 0: no bench).",
    }
)
@user_errors
def demo(ctx: Context, profile: str = DEMO_PROFILE, bench_seconds: int = BENCH_SECONDS) -> None:
    """Bring the lab up, provision it with a P/D profile, show every unit's state, then bench both pools."""
    from rich.console import Console

    from pdfleet.fleet.provision import provision
    from pdfleet.fleet.status import fleet_status
    from pdfleet.lab.control import up
    from pdfleet.ops.report import print_report

    console = Console(stderr=True)
    up(this_lab(), lab_progress(console))
    progress = lambda msg: console.print(msg, highlight=False)  # noqa: E731 - a one-line callback
    deployment = open_deployment(
        ctx, profile, str(REPO_ROOT / LAB_INVENTORY), keys="provision", wheel=progress, fleet_layout=True
    )
    hosts = deployment.hosts
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
    if bench_seconds > 0:
        _bench(ctx, profile, bench_seconds, console)
    console.print(
        'reach the gateway with an OpenAI client: eval "$(invoke lab.env)"; '
        "take the lab down: invoke lab.down"
    )


def _bench(ctx: Context, profile: str, seconds: int, console: Console) -> None:
    """The closing bench: long-prompt mix through the gateway to each pool; headline table and verdict."""
    console.print(f"demo: bench, long-prompt mix, {seconds} s per pool (colocated, then P/D)")
    opts = {
        "workload": "long-prompt-mix",
        "rate": None,
        "concurrency": None,
        "duration": str(seconds),
        "num_prompts": None,
        "pools": None,
        "sweep": False,
        "seed": None,
        "burstiness": None,
        "dataset": None,
        "input_len": None,
        "output_len": None,
        "range_ratio": None,
        "long_share": None,
        "warmup": None,
    }
    doc, verdict, out_dir = run_bench(ctx, profile, str(REPO_ROOT / LAB_INVENTORY), opts, None, console)
    down = print_outcome(doc, verdict, out_dir, console)
    if down:
        console.print("[red]demo: " + "; ".join(down) + "[/]")
        raise Exit(code=1)
