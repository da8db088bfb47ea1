"""The printed summary: a host × ok/changed/skipped/failed table with errors, and diffs in check mode."""

from __future__ import annotations

from rich.console import Console

from pdfleet.ops.base import Skip
from pdfleet.ops.report import console_progress, print_report
from pdfleet.ops.runner import HostReport, Report


def sample(check: bool) -> Report:
    good = HostReport(
        "lab-p1", ok=7, changed=2, skipped=1, skips=[Skip("gpu_driver", "no NVIDIA GPU on PCI bus")]
    )
    good.changes = [{"op": "file /etc/pdfleet/a.conf", "diff": "-port=1\n+port=2"}]
    bad = HostReport("lab-d1")
    bad.fail("cannot connect to lab-d1 (198.18.0.31:22): Connection refused")
    return Report({"lab-p1": good, "lab-d1": bad}, check=check)


def render(report: Report) -> str:
    console = Console(record=True, width=160, color_system=None)
    print_report(report, console)
    return console.export_text()


def test_table_has_counts_errors_and_totals() -> None:
    text = render(sample(check=False))
    assert "lab-p1" in text and "lab-d1" in text
    assert "Connection refused" in text and "no NVIDIA GPU on PCI bus" in text
    total = next(line for line in text.splitlines() if "total" in line)
    assert [cell.strip() for cell in total.split("│")[1:6]] == ["total", "7", "2", "1", "1"]
    assert "+port=2" not in text  # diffs only in check mode


def test_check_mode_prints_diffs() -> None:
    text = render(sample(check=True))
    assert "file /etc/pdfleet/a.conf" in text and "+port=2" in text and "would change" in text


def test_console_progress_lines() -> None:
    console = Console(record=True, width=120, color_system=None)
    emit = console_progress(console)
    emit("lab-p1", "planned: 2 operation(s) to change")
    emit("lab-d1", "FAILED: cannot connect")
    assert console.export_text().splitlines() == [
        "lab-p1: planned: 2 operation(s) to change",
        "lab-d1: FAILED: cannot connect",
    ]


def test_multi_line_errors_are_printed_in_full_below_the_table() -> None:
    report = sample(check=False)
    report.hosts["lab-d1"].fail(
        "service vllm-decode.service: `systemctl start` exited 1\n--- journalctl ---\nOOM"
    )
    text = render(report)
    table, _, rest = text.partition("lab-d1: error")
    assert "--- journalctl ---" not in table and "--- journalctl ---\nOOM" in rest
