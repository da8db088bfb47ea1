"""Generated shell commands run for real on this machine: sudo quoting, health waits, atomic install."""

from __future__ import annotations

import http.server
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.ops.base import Upload
from pdfleet.ops.operations import health_wait
from pdfleet.ops.runner import CommandError, execute
from pdfleet.ops.ssh import LocalTransport, known_hosts_pattern, sudo_wrap


def test_sudo_wrap_quotes_any_command() -> None:
    cmd = "a='x y'; echo \"$a\" | tr ' ' _; printf '%s\\n' \"it's\""
    assert sudo_wrap(cmd, "root") == cmd
    wrapped = sudo_wrap(cmd, "ops")
    assert wrapped.startswith("sudo -n -- sh -c ")
    # what sudo would exec: the same shell command, intact
    out = LocalTransport().run(wrapped.removeprefix("sudo -n -- "))
    assert out.rc == 0 and out.stdout == "x_y\nit's\n"


def test_known_hosts_pattern() -> None:
    assert known_hosts_pattern("198.18.0.21", 22) == "198.18.0.21"
    assert known_hosts_pattern("127.0.0.1", 2222) == "[127.0.0.1]:2222"


@pytest.fixture()
def health_server(tmp_path: Path) -> Iterator[int]:
    """A loopback HTTP server whose /health answers 200."""
    (tmp_path / "health").write_text("ok")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args):  # type: ignore[no-untyped-def]
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def test_health_wait_passes_when_health_answers(health_server: int) -> None:
    wait = health_wait("x.service", f"http://127.0.0.1:{health_server}/health", timeout=10)
    out = LocalTransport().run(wait.cmd)
    assert out.rc == 0, out.stderr


def test_health_wait_times_out_with_journal_diagnostics() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    wait = health_wait("x.service", f"http://127.0.0.1:{port}/health", timeout=1)
    with pytest.raises(CommandError) as err:
        execute(LocalTransport(), wait, timeout=30)
    message = str(err.value)
    assert f"x.service: http://127.0.0.1:{port}/health did not answer within 1s" in message
    assert "--- journalctl -u x.service -n 30 --no-pager ---" in message


def test_health_wait_quotes_values_from_the_profile(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    marker = tmp_path / "injected"
    url = f"http://127.0.0.1:{port}/health?x=';touch {marker};'"
    out = LocalTransport().run(health_wait("x.service", url, timeout=1).cmd)
    assert out.rc == 1 and f"{url} did not answer within 1s" in out.stderr
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="install -o root needs root")
def test_upload_is_atomic_install_with_mode_and_no_leftovers(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "f.env"
    before = set(Path("/tmp").glob("pdfleet-upload-*"))
    execute(LocalTransport(), Upload(b"K=v\n", str(dest), "0600", "root", "root"), timeout=10)
    assert dest.read_bytes() == b"K=v\n" and oct(dest.stat().st_mode & 0o777) == "0o600"
    assert set(Path("/tmp").glob("pdfleet-upload-*")) == before
    assert not list(dest.parent.glob(".*pdfleet-tmp"))
    with pytest.raises(CommandError, match="upload"):
        execute(LocalTransport(), Upload(b"x", str(dest), "0600", "no-such-user", "root"), timeout=10)
    assert dest.read_bytes() == b"K=v\n"  # a failed install leaves the old file intact
