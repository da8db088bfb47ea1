"""How the runner reaches a host: a Fabric connection with strict host-key checking, or this machine.

Host keys are checked against one known_hosts file (the host's `known_hosts_file`, else the run's
default). An unknown or changed key is a ConnectError that says how to trust or replace it; a key
is never accepted silently. Commands needing root go through `sudo -n` unless the user is root.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut
from paramiko.ssh_exception import NoValidConnectionsError

from pdfleet.errors import ConnectError


class HostLike(Protocol):
    """The inventory Host attributes a connection needs, read-only (the inventory's Host is frozen)."""

    @property
    def name(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def key_file(self) -> str | None: ...
    @property
    def known_hosts_file(self) -> str | None: ...


@dataclass(frozen=True)
class Output:
    """A finished command: exit code and captured output."""

    rc: int
    stdout: str
    stderr: str


class Transport(Protocol):
    """Runs commands on one host and stages uploads there."""

    name: str

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
        """Run a shell command (as root when `sudo`), never raising on a non-zero exit."""
        ...

    def put(self, data: bytes) -> str:
        """Write `data` to a fresh private (0600) temp file on the host and return its path."""
        ...

    def send(
        self, cmd: str, chunks: Iterable[bytes], sudo: bool = False, timeout: float | None = None
    ) -> Output:
        """Run a shell command with `chunks` as its stdin, sent as they come (a file streamed, never
        whole in memory); `timeout` bounds each wait (no progress for that long), not the whole copy."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


# A login user's PATH often lacks the sbin directories (sysctl, modprobe live there); sudo has
# secure_path, so only commands run as the login user need this.
SBIN_PATH = 'PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"; export PATH; '


def remote_command(cmd: str, user: str, sudo: bool) -> str:
    """The command line to send: through sudo when root is needed, else with sbin on PATH."""
    return sudo_wrap(cmd, user) if sudo else SBIN_PATH + cmd


def sudo_wrap(cmd: str, user: str) -> str:
    """The command run as root: unchanged for root, else through non-interactive sudo."""
    if user == "root":
        return cmd
    return f"sudo -n -- sh -c {shlex.quote(cmd)}"


class _UnknownHostKey(paramiko.SSHException):
    """Raised by the reject policy so the caller can name the key it refused."""

    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.key = key


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy, but keeping the offered key for the error message."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname, key)


def known_hosts_pattern(address: str, port: int) -> str:
    """How OpenSSH and paramiko name a host in known_hosts."""
    return address if port == 22 else f"[{address}]:{port}"


class SshTransport:
    """A Fabric Connection to one host."""

    def __init__(self, host: HostLike, conn: Connection) -> None:
        self.name = host.name
        self.user = conn.user
        self._conn = conn

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
        """Run through the SSH session; a timeout becomes exit code 124 like coreutils `timeout`."""
        full = remote_command(cmd, self.user, sudo)
        try:
            result = self._conn.run(full, hide=True, warn=True, in_stream=False, pty=False, timeout=timeout)
        except CommandTimedOut as exc:
            return Output(124, exc.result.stdout, exc.result.stderr + f"\ntimed out after {timeout}s")
        return Output(result.exited, result.stdout, result.stderr)

    def put(self, data: bytes) -> str:
        """Upload over SFTP into /tmp; the file is made 0600 before any byte is written."""
        path = f"/tmp/pdfleet-upload-{uuid.uuid4().hex}"
        sftp = self._conn.sftp()
        with sftp.open(path, "wx") as remote:  # exclusive create: never follow a planted file
            remote.chmod(0o600)
            remote.write(data)
        return path

    def send(
        self, cmd: str, chunks: Iterable[bytes], sudo: bool = False, timeout: float | None = None
    ) -> Output:
        """Over a channel of this connection's paramiko transport (Fabric's run decodes stdin as text)."""
        transport = self._conn.client.get_transport()
        if transport is None:
            raise ConnectError(f"{self.name}: the SSH connection is closed")
        chan = transport.open_session(timeout=timeout)
        try:
            chan.settimeout(timeout)
            chan.exec_command(remote_command(cmd, self.user, sudo))
            with contextlib.suppress(OSError):  # the command exited early: its status and stderr say why
                for chunk in chunks:
                    chan.sendall(chunk)
            chan.shutdown_write()
            stdout = chan.makefile("rb").read().decode(errors="replace")
            stderr = chan.makefile_stderr("rb").read().decode(errors="replace")
            return Output(chan.recv_exit_status(), stdout, stderr)
        except TimeoutError:
            return Output(124, "", f"no progress for {timeout}s")
        finally:
            chan.close()

    def close(self) -> None:
        self._conn.close()

    @property
    def client(self) -> paramiko.SSHClient:
        """The open paramiko client, for tools that speak SSH through it (verify's testinfra backend)."""
        return self._conn.client


class LocalTransport:
    """This machine as a host (`sh -c`), for the control node itself and for tests of the runner."""

    def __init__(self, name: str = "localhost") -> None:
        self.name = name
        self.user = "root" if os.geteuid() == 0 else os.environ.get("USER", "")

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
        """Run through `sh -c`."""
        full = remote_command(cmd, self.user, sudo)
        try:
            proc = subprocess.run(
                ["sh", "-c", full], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            return Output(124, "", f"timed out after {timeout}s")
        return Output(proc.returncode, proc.stdout, proc.stderr)

    def put(self, data: bytes) -> str:
        """A private temp file in /tmp."""
        fd, path = tempfile.mkstemp(prefix="pdfleet-upload-", dir="/tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return path

    def send(
        self, cmd: str, chunks: Iterable[bytes], sudo: bool = False, timeout: float | None = None
    ) -> Output:
        """Through `sh -c`'s stdin."""
        full = remote_command(cmd, self.user, sudo)
        proc = subprocess.Popen(
            ["sh", "-c", full], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):  # the command exited early: its status says why
            for chunk in chunks:
                proc.stdin.write(chunk)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return Output(124, "", f"timed out after {timeout}s")
        return Output(proc.returncode, stdout.decode(errors="replace"), stderr.decode(errors="replace"))

    def close(self) -> None:
        return None


def _fingerprint(key: paramiko.PKey) -> str:
    """The key type and SHA256 fingerprint as OpenSSH prints them."""
    return f"{key.get_name()} {key.fingerprint}"


def _load_host_keys(keys: paramiko.HostKeys, path: Path) -> None:
    """Add the known_hosts entries from `path` (an absent file adds none)."""
    if path.exists():
        try:
            keys.load(str(path))
        except (OSError, paramiko.SSHException, ValueError) as exc:
            raise ConnectError(f"cannot read known_hosts file {path}: {exc}") from None


class _TransientConnectError(ConnectError):
    """A failure worth one more try (refused while booting, banner not sent yet, reset)."""


CONNECT_ATTEMPTS = 3
CONNECT_RETRY_PAUSE = 1.0


def open_connection(
    host: HostLike, known_hosts: str, connect_timeout: float, check_sudo: bool = True
) -> SshTransport:
    """Connect and authenticate to `host`, verifying its key against the known_hosts file, and (with
    `check_sudo`) check that sudo needs no password: the runner skips that round trip, its first fact
    batch runs through sudo and fails with sudo's own message.

    Refused/reset connections and late banners are retried briefly (a host that is still
    booting); key and login problems and timeouts are not.
    """
    known = Path(host.known_hosts_file or known_hosts).expanduser()
    connect_kwargs: dict[str, Any] = {"banner_timeout": connect_timeout, "auth_timeout": connect_timeout}
    if host.key_file:
        key_file = str(Path(host.key_file).expanduser())
        if not Path(key_file).is_file():
            raise ConnectError(f"SSH key file {key_file} for {host.name} does not exist")
        connect_kwargs.update(key_filename=key_file, look_for_keys=False, allow_agent=False)
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            conn = _open(host, known, connect_timeout, connect_kwargs)
            break
        except _TransientConnectError:
            if attempt == CONNECT_ATTEMPTS:
                raise
            time.sleep(CONNECT_RETRY_PAUSE)
    transport = SshTransport(host, conn)
    if check_sudo and transport.user != "root":
        check = transport.run("sudo -n true", timeout=connect_timeout)
        if check.rc != 0:
            transport.close()
            raise ConnectError(
                f"{host.user}@{host.name} cannot run sudo without a password: {check.stderr.strip()}"
            )
    return transport


def _open(host: HostLike, known: Path, connect_timeout: float, connect_kwargs: dict[str, Any]) -> Connection:
    """One connection attempt; every failure becomes a ConnectError saying what to do."""
    where = f"{host.name} ({host.address}:{host.port})"
    # our inventory is the only source of addresses, ports and users: ignore ~/.ssh/config
    config = Config(overrides={"load_ssh_configs": False})
    conn = Connection(
        host.address,
        user=host.user,
        port=host.port,
        config=config,
        connect_timeout=max(1, int(connect_timeout)),
        connect_kwargs=dict(connect_kwargs),
    )
    conn.client.set_missing_host_key_policy(_RejectUnknown())
    _load_host_keys(conn.client.get_host_keys(), known)
    try:
        conn.open()
    except _UnknownHostKey as exc:
        raise ConnectError(
            f"host key for {where} is not in {known}; to trust it run: "
            f"ssh-keyscan -p {host.port} {host.address} >> {known} "
            f"(first check that the host's key is {_fingerprint(exc.key)})"
        ) from None
    except paramiko.BadHostKeyException as exc:
        pattern = known_hosts_pattern(host.address, host.port)
        raise ConnectError(
            f"host key for {where} has CHANGED: {known} has {_fingerprint(exc.expected_key)}, the host "
            f"offered {_fingerprint(exc.key)}. This may be an attack. If the host was reinstalled, "
            f"remove the old key with: ssh-keygen -R '{pattern}' -f {known}, then trust the new one with: "
            f"ssh-keyscan -p {host.port} {host.address} >> {known}"
        ) from None
    except paramiko.AuthenticationException as exc:
        how = f"key {host.key_file}" if host.key_file else "the default keys/agent"
        raise ConnectError(f"cannot log in to {where} as {host.user} with {how}: {exc}") from None
    except TimeoutError:
        raise ConnectError(f"cannot connect to {where}: timed out after {connect_timeout:g}s") from None
    except NoValidConnectionsError as exc:
        reasons = "; ".join(sorted({e.strerror or str(e) for e in exc.errors.values()}))
        raise _TransientConnectError(f"cannot connect to {where}: {reasons}") from None
    except (OSError, paramiko.SSHException, EOFError) as exc:
        raise _TransientConnectError(f"cannot connect to {where}: {exc or type(exc).__name__}") from None
    return conn
