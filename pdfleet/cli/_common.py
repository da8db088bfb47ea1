"""Helpers shared by task modules: turning PdfleetError into a clean exit, reading invoke.yaml."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from invoke import Context
from invoke.exceptions import Exit

from pdfleet.errors import PdfleetError

F = TypeVar("F", bound=Callable[..., Any])

REPO_ROOT = Path(__file__).resolve().parents[2]


def user_errors(func: F) -> F:
    """Print a PdfleetError as one paragraph on stderr and exit non-zero, without a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PdfleetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def setting(ctx: Context, key: str, default: Any = None) -> Any:
    """A value from the `pdfleet:` section of invoke.yaml (or its overrides)."""
    section = ctx.config.get("pdfleet", {}) or {}
    return section.get(key, default)


def repo_path(value: str | Path) -> Path:
    """A path from config or an option: relative paths are taken from the repo root."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path
