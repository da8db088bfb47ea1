"""Printing a fleet run: a progress line per host event, a summary table, diffs in check mode."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pdfleet.ops.runner import Progress, Report


def console_progress(console: Console) -> Progress:
    """A progress callback printing `host: message` lines (safe from the runner's threads)."""
    lock = threading.Lock()

    def emit(host: str, message: str) -> None:
        style = "red" if message.startswith("FAILED") else ""
        with lock:
            console.print(Text(f"{host}: ", style="bold") + Text(message, style=style), highlight=False)

    return emit


def summary_table(report: Report) -> Table:
    """Hosts × ok/changed/skipped/failed plus the error, with a totals row."""
    title = "check (nothing changed)" if report.check else "apply"
    table = Table(title=f"pdfleet {title}", show_lines=False)
    table.add_column("host", style="bold")
    table.add_column("ok", justify="right", style="green")
    table.add_column("would change" if report.check else "changed", justify="right", style="yellow")
    table.add_column("skipped", justify="right", style="cyan")
    table.add_column("failed", justify="right", style="red")
    table.add_column("error / skip reasons", overflow="fold")
    for name, host in report.hosts.items():
        # the table keeps one line per error; print_report shows multi-line errors in full below it
        notes = (
            host.error.splitlines()[0]
            if host.error
            else "; ".join(f"{s.what}: {s.reason}" for s in host.skips)
        )
        table.add_row(
            name,
            str(host.ok),
            str(host.changed),
            str(host.skipped),
            str(host.failed),
            Text(notes, style="red" if host.error else "dim"),
        )
    totals = report.totals
    table.add_section()
    table.add_row("total", *(str(totals[k]) for k in ("ok", "changed", "skipped", "failed")), "")
    return table


def print_diffs(console: Console, report: Report) -> None:
    """Each host's planned (or applied) changes with their diffs (secrets already redacted)."""
    for name, host in report.hosts.items():
        if not host.changes:
            continue
        console.rule(f"{name}: {host.changed} operation(s)")
        for change in host.changes:
            console.print(Text(f"• {change['op']}", style="bold yellow"), highlight=False)
            for line in change["diff"].splitlines():
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                console.print(Text(f"    {line}", style=style), highlight=False, soft_wrap=True)


def print_report(report: Report, console: Console | None = None) -> None:
    """The summary table, preceded by the diffs in check mode."""
    console = console or Console()
    if report.check:
        print_diffs(console, report)
    console.print(summary_table(report))
    for name, host in report.hosts.items():
        if host.error and "\n" in host.error:
            console.rule(f"{name}: error", style="red")
            console.print(Text(host.error), highlight=False, soft_wrap=True)
