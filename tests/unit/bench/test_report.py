"""Markdown tables and notes."""

from __future__ import annotations

from pdfleet.bench.report import markdown_table, note


def test_markdown_table() -> None:
    """Header, separator, one line per row; cells through str()."""
    assert markdown_table(["a", "b c"], [[1, "x"], [2.5, "-"]]) == [
        "| a | b c |",
        "|---|---|",
        "| 1 | x |",
        "| 2.5 | - |",
    ]
    assert markdown_table(["only"], []) == ["| only |", "|---|"]


def test_note_only_when_there_is_something_to_say() -> None:
    """Items joined by '; ' between the lead and the tail, after a blank line; nothing without items."""
    assert note("slow: ", ["a at 1", "b at 2"], ". Rerun.") == ["", "note: slow: a at 1; b at 2. Rerun."]
    assert note("slow: ", [], ". Rerun.") == []
