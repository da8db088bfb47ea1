"""Turning pydantic errors into pdfleet's one-paragraph 'FILE: key.path: problem' messages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticValidationError


def _key_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a dotted key path (list indices in brackets)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def format_pydantic_errors(source: Path, exc: PydanticValidationError) -> str:
    """One line per problem: 'FILE: key.path: what is wrong / allowed'."""
    lines = []
    for err in exc.errors():
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not part of the schema)"
        elif err["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{source}: {_key_path(err['loc'])}: {msg}")
    return "\n".join(lines)
