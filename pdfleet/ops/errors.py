"""What stops a host's plan: a fact whose output makes no sense, an operation that cannot be planned."""

from __future__ import annotations

from pdfleet.errors import PdfleetError


class OperationError(PdfleetError):
    """An operation cannot be planned on this host (e.g. a directory where a file should be)."""


class FactError(Exception):
    """A fact's command output could not be understood (the host is not what the op expects)."""
