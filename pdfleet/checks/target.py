"""How verify's checks reach a host: testinfra's paramiko backend over the connection pdfleet.ops.ssh opens,
so verify trusts host keys exactly as provision does (one known_hosts, unknown or changed keys refused with
the fix) and there is one SSH stack, not an OpenSSH one beside paramiko."""

from __future__ import annotations

from typing import Any

import paramiko
from testinfra.backend.base import CommandResult
from testinfra.backend.paramiko import ParamikoBackend
from testinfra.host import Host as TestinfraHost

from pdfleet.ops.ssh import SshTransport


class TransportBackend(ParamikoBackend):
    """testinfra's paramiko backend whose client is an already open, already verified ops.ssh connection;
    it never opens one of its own (testinfra's would warn and go on past an unknown host key)."""

    NAME = "pdfleet"

    def __init__(self, transport: SshTransport, sudo: bool) -> None:
        self._transport = transport
        super().__init__(transport.name, sudo=sudo)

    @property
    def client(self) -> paramiko.SSHClient:
        """The verified connection's client."""
        return self._transport.client

    def run(self, command: str, *args: str, **kwargs: Any) -> CommandResult:
        """Run through the connection; a broken one is an error, never a reconnect with other settings."""
        cmd = self.encode(self.get_command(command, *args))
        rc, stdout, stderr = self._exec_command(cmd)
        return self.result(rc, cmd, stdout, stderr)


def testinfra_host(transport: SshTransport) -> TestinfraHost:
    """The testinfra host over an ops.ssh connection (commands through sudo unless the user is root)."""
    return TestinfraHost(TransportBackend(transport, sudo=transport.user != "root"))
