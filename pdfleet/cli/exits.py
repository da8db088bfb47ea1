"""How tasks end on an operator's mistake: one paragraph on stderr and a non-zero exit, no traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from invoke.exceptions import Exit

from pdfleet.errors import PdfleetError

F = TypeVar("F", bound=Callable[..., Any])


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
