"""systemd: unit/service plans on the unit-health fact, health waits run for real, and quoting."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.ops.base import DAEMON_RELOAD, FakeFacts, Run
from pdfleet.ops.errors import OperationError
from pdfleet.ops.files import FileState
from pdfleet.ops.runner import CommandError, execute
from pdfleet.ops.ssh import LocalTransport
from pdfleet.ops.systemd import (
    MANAGED_MARKER,
    ManagedUnitFiles,
    RetireUnits,
    Service,
    SystemdUnit,
    env_value,
    health_wait,
    restart_handler,
    systemd_arg,
    systemd_command,
)
from pdfleet.ops.unit_health import UnitHealth, UnitState, http_code_cmd
from tests.unit.ops.helpers import commands, file_info

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

UNIT = "[Unit]\nDescription=x\n[Service]\nExecStart=/bin/true\n"
RUNNING = UnitState("loaded", "active", "running", "enabled")
MISSING = UnitState("not-found", "inactive", "dead", "")


def test_systemd_unit_notifies_reload_and_restart() -> None:
    restart = restart_handler("vllm-decode.service", "http://127.0.0.1:8200/health", timeout=600)
    op = SystemdUnit("vllm-decode.service", UNIT, restart=restart)
    path = "/etc/systemd/system/vllm-decode.service"
    assert op.plan(FakeFacts({FileState(path): file_info(UNIT)})) == []
    changes = op.plan(FakeFacts({FileState(path): None}))
    assert commands(changes) == [(path, "0644", "root", "root", UNIT.encode())]
    assert changes[0].notify == (DAEMON_RELOAD, restart)
    assert restart.unit == "vllm-decode.service"
    assert [c.cmd for c in restart.commands if isinstance(c, Run)][
        0
    ] == "systemctl reset-failed vllm-decode.service 2>/dev/null; systemctl restart vllm-decode.service"
    wait = restart.commands[1]
    assert isinstance(wait, Run) and http_code_cmd("http://127.0.0.1:8200/health") in wait.cmd
    assert wait.on_fail == "journalctl -u vllm-decode.service -n 30 --no-pager"


def test_service_converged_and_start_with_health() -> None:
    op = Service("vllm-prefill.service", health_url="http://127.0.0.1:8100/health", health_timeout=900)
    assert op.plan(FakeFacts({UnitHealth("vllm-prefill.service"): RUNNING})) == []
    # unit file written earlier in this same run: facts say not-found; still plan enable + start
    changes = op.plan(FakeFacts({UnitHealth("vllm-prefill.service"): MISSING}))
    cmds = commands(changes)
    assert cmds[0] == "systemctl enable vllm-prefill.service"
    assert cmds[1] == (
        "systemctl reset-failed vllm-prefill.service 2>/dev/null; systemctl start vllm-prefill.service"
    )
    assert http_code_cmd("http://127.0.0.1:8100/health") in str(cmds[2]) and "900" in str(cmds[2])
    assert changes[1].starts_unit == "vllm-prefill.service"
    assert all(c.flush == (DAEMON_RELOAD,) for c in changes)
    start = changes[1].commands[0]
    assert isinstance(start, Run) and start.on_fail == "journalctl -u vllm-prefill.service -n 30 --no-pager"


def test_service_stop_disable_and_masked() -> None:
    op = Service("old.service", enabled=False, running=False)
    assert commands(op.plan(FakeFacts({UnitHealth("old.service"): RUNNING}))) == [
        "systemctl disable old.service",
        "systemctl stop old.service",
    ]
    masked = UnitState("masked", "inactive", "dead", "masked")
    with pytest.raises(OperationError, match="masked"):
        Service("m.service").plan(FakeFacts({UnitHealth("m.service"): masked}))


def test_service_without_a_desired_state_leaves_the_unit_alone() -> None:
    op = Service("x.service", enabled=None, running=None)
    assert op.plan(FakeFacts({UnitHealth("x.service"): RUNNING})) == []
    assert op.plan(FakeFacts({UnitHealth("x.service"): MISSING})) == []


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


@pytest.mark.parametrize(
    ("word", "quoted"),
    [
        ("plain/path-1.0", "plain/path-1.0"),
        ('{"kv_role":"kv_producer"}', '\'{"kv_role":"kv_producer"}\''),
        ("50%", "50%%"),
        ("$HOME", "'$$HOME'"),
        ("it's", '"it\'s"'),
        ('a\\"b', '"a\\\\\\"b"'),
    ],
)
def test_systemd_arg_quoting(word: str, quoted: str) -> None:
    assert systemd_arg(word) == quoted


def test_systemd_command_and_env_value_quoting() -> None:
    assert systemd_command(["/opt/v/bin/vllm", "serve", "--x", "50%"]) == "/opt/v/bin/vllm serve --x 50%%"
    assert env_value(3) == "3" and env_value("rc,ud:1") == "rc,ud:1"
    assert env_value("a b") == '"a b"'
    assert env_value('say "hi" \\') == '"say \\"hi\\" \\\\"'


def test_managed_unit_files_lists_only_units_carrying_pdfleets_marker(tmp_path: Path) -> None:
    (tmp_path / "vllm-prefill.service").write_text(f"{MANAGED_MARKER} local edits are reverted\n[Unit]\n")
    (tmp_path / "vllm-router-pd.service").write_text(f"{MANAGED_MARKER} x\n")
    (tmp_path / "vllm-mine.service").write_text("[Unit]\nDescription=an operator's own\n")
    (tmp_path / "pdfleet-gateway.service").write_text(f"{MANAGED_MARKER} x\n")  # not matching the glob
    fact = ManagedUnitFiles("vllm-*.service", str(tmp_path))
    out = LocalTransport().run(fact.command())
    assert fact.parse(out.stdout, out.rc) == {"vllm-prefill.service", "vllm-router-pd.service"}
    empty = ManagedUnitFiles("vllm-*.service", str(tmp_path / "none"))
    out = LocalTransport().run(empty.command())
    assert out.rc == 0 and empty.parse(out.stdout, out.rc) == frozenset()


def test_retire_units_removes_what_is_not_kept_and_nothing_on_a_second_run(tmp_path: Path) -> None:
    units, env = tmp_path / "units", tmp_path / "env"
    units.mkdir()
    env.mkdir()
    op = RetireUnits("vllm-*.service", frozenset({"vllm-m-colocated.service"}), str(env), str(units))
    fact = ManagedUnitFiles("vllm-*.service", str(units))
    found = frozenset({"vllm-m-colocated.service", "vllm-prefill.service", "vllm-router-pd.service"})
    changes = op.plan(FakeFacts({fact: found}))
    assert [c.diff for c in changes] == [
        f"stop, disable and remove vllm-prefill.service and {env}/vllm-prefill.env (not run here)",
        f"stop, disable and remove vllm-router-pd.service and {env}/vllm-router-pd.env (not run here)",
    ]
    assert commands(changes)[:2] == [
        "systemctl disable --now vllm-prefill.service",
        f"systemctl reset-failed vllm-prefill.service 2>/dev/null; rm -f {units}/vllm-prefill.service "
        f"{env}/vllm-prefill.env",
    ]
    assert all(c.notify == (DAEMON_RELOAD,) for c in changes)
    # the removal itself, without systemctl: the files go, the kept unit's stay
    for name in found:
        (units / name).write_text(f"{MANAGED_MARKER}\n")
    (env / "vllm-prefill.env").write_text("X=1\n")
    (env / "vllm-m-colocated.env").write_text("X=1\n")
    for cmd in commands(changes)[1::2]:
        assert LocalTransport().run(str(cmd).replace("systemctl", "true")).rc == 0
    assert sorted(p.name for p in units.iterdir()) == ["vllm-m-colocated.service"]
    assert sorted(p.name for p in env.iterdir()) == ["vllm-m-colocated.env"]
    out = LocalTransport().run(fact.command())
    assert op.plan(FakeFacts({fact: fact.parse(out.stdout, out.rc)})) == []  # a second run changes 0
