"""Human diffs for the operator: unified text diffs cut to a readable length, bytes shown only as text."""

from __future__ import annotations

import difflib

DIFF_MAX_LINES = 200


def unified(old: str, new: str, path: str) -> str:
    """A unified diff of two texts, cut at DIFF_MAX_LINES lines."""
    lines = list(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"{path} (current)", f"{path}"
        )
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines[:DIFF_MAX_LINES])
    if len(lines) > DIFF_MAX_LINES:
        text += f"... ({len(lines) - DIFF_MAX_LINES} more diff lines)\n"
    return text.rstrip("\n")


def as_text(data: bytes, limit: int) -> str | None:
    """Bytes as text for a diff, None when binary or too large."""
    if len(data) > limit:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
