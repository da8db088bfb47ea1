"""User-facing errors: one paragraph that says what was wrong and where, never a traceback."""


class PdfleetError(Exception):
    """An error an operator can act on; tasks print its message and exit non-zero."""

    exit_code = 2


class ValidationError(PdfleetError):
    """Bad input (profile, inventory, option): nothing has been changed."""


class ConnectError(PdfleetError):
    """A host could not be reached or failed host-key verification."""
