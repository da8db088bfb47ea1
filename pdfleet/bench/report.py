"""Markdown pieces of benchmark reports: tables from rows of cells, and notes that appear only when needed."""

from __future__ import annotations

from collections.abc import Sequence


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table's lines: the header, the separator, one line per row (cells as str())."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def note(lead: str, items: Sequence[str], tail: str) -> list[str]:
    """A blank line and `note: LEAD ITEM; ITEM. TAIL` when there are items, else nothing."""
    if not items:
        return []
    return ["", f"note: {lead}" + "; ".join(items) + tail]
