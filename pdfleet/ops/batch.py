"""Many facts in one remote command: the shell script that gathers them all, and its output split back.

Each fact (or each group a fact class combines into one command, e.g. one `stat` for many paths)
runs in its own subshell between marker lines carrying a per-batch random token, so one fact's
output or exit can never be taken for another's, and each fact's own `parse` reads exactly what its
own command would have printed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.ops.base import Combined, Fact, RawOutput


@dataclass(frozen=True)
class _Unit:
    """One subshell of the batch: a single fact, or several that one combined command answers."""

    facts: tuple[Fact[Any], ...]
    command: str
    combined: Combined | None = None


@dataclass(frozen=True)
class BatchResult:
    """Per fact, what its command printed and its exit code; `stderr` per fact for error messages."""

    outputs: dict[Fact[Any], RawOutput]
    stderr: dict[Fact[Any], str]


def _units(facts: Sequence[Fact[Any]]) -> list[_Unit]:
    """Facts grouped by class; a class that combines a group gets one unit for the group."""
    by_class: dict[type[Fact[Any]], list[Fact[Any]]] = {}
    for fact in dict.fromkeys(facts):
        by_class.setdefault(type(fact), []).append(fact)
    units: list[_Unit] = []
    for cls, group in by_class.items():
        combined = cls.combine(group) if len(group) > 1 else None
        if combined is not None:
            units.append(_Unit(tuple(group), combined.command, combined))
        else:
            units += [_Unit((f,), f.command()) for f in group]
    return units


def batch_script(facts: Sequence[Fact[Any]], token: str) -> tuple[str, list[_Unit]]:
    """The script gathering `facts` (duplicates once), and its units in order. `token` must be random:
    it makes the marker lines impossible to forge from a fact's output."""
    if not re.fullmatch(r"[0-9a-f]{16,}", token):
        raise ValueError("batch token must be at least 16 hex digits")
    units = _units(facts)
    mark = f"@@pdfleet-{token}"
    parts = []
    for i, unit in enumerate(units):
        # the newline before `)` ends a trailing comment or here-doc in the fact's command
        parts.append(
            f"printf '%s\\n' '{mark} {i}'; printf '%s\\n' '{mark} {i}' >&2; "
            f"( {unit.command}\n) </dev/null; printf '\\n%s %d\\n' '{mark} rc {i}' $?"
        )
    return "\n".join(parts) + "\n", units


def _sections(text: str, mark: str, count: int) -> dict[int, str]:
    """Text after each `mark i` line up to the next marker line (stderr of unit i)."""
    pieces = re.split(rf"^{re.escape(mark)} (\d+)\n", text, flags=re.M)
    found = {int(pieces[k]): pieces[k + 1] for k in range(1, len(pieces) - 1, 2)}
    return {i: body for i, body in found.items() if i < count}


def split_batch(units: Sequence[_Unit], token: str, stdout: str, stderr: str) -> BatchResult:
    """Each fact's (stdout, rc) and stderr from the batch's output; a unit that did not finish (the
    batch was killed, or never started) is absent."""
    mark = f"@@pdfleet-{token}"
    outputs: dict[Fact[Any], RawOutput] = {}
    errors: dict[Fact[Any], str] = {}
    err_sections = _sections(stderr, mark, len(units))
    for i, unit in enumerate(units):
        head = f"{mark} {i}\n"
        begin = stdout.find(head)
        end = stdout.find(f"\n{mark} rc {i} ", begin + len(head)) if begin >= 0 else -1
        if begin < 0 or end < 0:
            continue
        body = stdout[begin + len(head) : end]
        rc_line = stdout[end + 1 :].split("\n", 1)[0]
        rc = int(rc_line.rsplit(" ", 1)[1])
        if unit.combined is not None:
            outputs.update(unit.combined.split(body, rc))
        else:
            outputs[unit.facts[0]] = (body, rc)
        for fact in unit.facts:
            errors[fact] = err_sections.get(i, "")
    return BatchResult(outputs, errors)
