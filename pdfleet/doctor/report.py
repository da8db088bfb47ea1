"""Findings as the operator reads them: a rich table (what, evidence, fix), or JSON (`--json`)."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pdfleet.doctor.finding import Finding, has_error, sorted_findings

NO_PROBLEMS = "no problems found"
DEFAULT_WIDTH = 160  # when stdout is not a terminal (a pipe, a CI log)
MIN_WIDTH = 100
STYLE = {"error": "bold red", "warning": "yellow", "ok": "green"}

Rule = Callable[[Any], list[Finding]]


def run_rules(rules: Iterable[Rule], facts: Any) -> list[Finding]:
    """Every rule over the same facts, findings in rule order."""
    return [f for rule in rules for f in rule(facts)]


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    """How many findings of each severity."""
    return {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "ok")}


def to_json(findings: Sequence[Finding], view: str, target: str) -> str:
    """The `--json` document: the view, its target, counts, and every finding (errors first)."""
    doc = {
        "view": view,
        "target": target,
        "ok": not has_error(findings),
        "counts": summary(findings),
        "findings": [f.to_json() for f in sorted_findings(findings)],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def format_table(findings: Sequence[Finding], title: str, width: int | None = None) -> str:
    """The findings as a table (errors, warnings, then what passed), and 'no problems found' when no error
    or warning is among them."""
    out = io.StringIO()
    width = width or max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 40)).columns)
    console = Console(file=out, width=width, force_terminal=False, color_system=None, soft_wrap=False)
    problems = [f for f in findings if f.severity != "ok"]
    table = Table(title=title, show_lines=True, expand=False)
    for name, ratio in (("", 0), ("what", 3), ("evidence", 4), ("fix", 3)):
        table.add_column(name, ratio=ratio or None, overflow="fold")
    for f in sorted_findings(findings):
        fix = f.fix + (f"\n{f.diff}" if f.diff else "")
        table.add_row(
            Text(f.severity, style=STYLE[f.severity]), f"{f.what}\n[{f.rule}]", Text(f.evidence), Text(fix)
        )
    console.print(table)
    counts = summary(findings)
    if not problems:
        console.print(f"{NO_PROBLEMS} ({counts['ok']} passed)")
    else:
        console.print(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['ok']} ok")
    return out.getvalue()
