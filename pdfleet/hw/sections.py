"""Output printed as `== name` sections, so one command (one SSH round trip) gives several facts."""

from __future__ import annotations


def split_sections(stdout: str) -> dict[str, list[str]]:
    """The lines under each `== name` header, by name; lines before the first header are dropped."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in stdout.splitlines():
        if line.startswith("== "):
            current = out.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return out
