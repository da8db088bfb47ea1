"""The loopback sshd fixture of the ops tests, shared for `invoke verify` tests against a real SSH server."""

from tests.unit.ops.conftest import sshd  # noqa: F401  (re-exported fixture)
