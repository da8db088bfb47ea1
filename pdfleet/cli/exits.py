"""How tasks end on an operator's mistake: one paragraph on stderr and a non-zero exit, no traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from invoke.exceptions import Exit

from pdfleet.errors import PdfleetError

P = ParamSpec("P")
R = TypeVar("R")


def user_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Print a PdfleetError as one paragraph on stderr and exit non-zero, without a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except PdfleetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code) from None

    return wrapper
