"""The SSH transport: sudo wrapping and known_hosts patterns, and the runner over real SSH (OpenSSH sshd
on loopback, Fabric/paramiko client, strict host keys)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from pdfleet.errors import ConnectError
from pdfleet.model.inventory import Host
from pdfleet.ops.base import FactSource, Operation, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.runner import RunOptions, run_fleet
from pdfleet.ops.ssh import LocalTransport, known_hosts_pattern, open_connection, sudo_wrap
from tests.unit.helpers import Sshd
from tests.unit.ops.helpers import ssh_host

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


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


def planner_under(root: Path):
    def planner(h: Host, facts: FactSource) -> Iterable[Operation | Skip]:
        base = root / h.name
        yield Directory(str(base), mode="0750")
        yield File(str(base / "app.conf"), "port=8100\nmodel=llama\n", mode="0640")
        yield File(str(base / "keys.env"), "API_KEY=sk-over-ssh-secret\n", mode="0600", secret=True)
        yield File(str(base / "limits.conf"), "* hard memlock unlimited\n")
        yield Directory(str(base / "cache"), mode="0700")

    return planner


OPTIONS = RunOptions(connect_timeout=5)


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_apply_twice_second_run_changes_nothing(sshd: Sshd, tmp_path: Path) -> None:
    h = ssh_host(sshd)
    first = run_fleet([h], planner_under(tmp_path), OPTIONS)
    assert first.hosts["loop"].error is None
    assert first.totals == {"ok": 0, "changed": 5, "skipped": 0, "failed": 0}
    assert (tmp_path / "loop" / "app.conf").read_text() == "port=8100\nmodel=llama\n"
    assert oct((tmp_path / "loop" / "keys.env").stat().st_mode & 0o777) == "0o600"
    second = run_fleet([h], planner_under(tmp_path), OPTIONS)
    assert second.totals["changed"] == 0 and second.totals["ok"] == 5 and second.totals["failed"] == 0


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_check_changes_nothing_and_reports_diffs(sshd: Sshd, tmp_path: Path) -> None:
    h = ssh_host(sshd)
    run_fleet([h], planner_under(tmp_path), OPTIONS)
    (tmp_path / "loop" / "app.conf").write_text("port=9999\nmodel=llama\n")
    report = run_fleet([h], planner_under(tmp_path), RunOptions(check=True, connect_timeout=5))
    assert report.totals["changed"] == 1
    [change] = report.hosts["loop"].changes
    assert "-port=9999" in change["diff"] and "+port=8100" in change["diff"]
    assert (tmp_path / "loop" / "app.conf").read_text() == "port=9999\nmodel=llama\n"  # untouched


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_unknown_host_key_is_a_clear_error(sshd: Sshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(ConnectError) as err:
        open_connection(ssh_host(sshd, known=empty), "~/.ssh/known_hosts", 5)
    message = str(err.value)
    assert f"is not in {empty}" in message
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {empty}" in message
    assert empty.read_text() == ""  # never added silently
    # and the runner reports it as that host's failure
    report = run_fleet([ssh_host(sshd, known=empty)], planner_under(tmp_path), OPTIONS)
    assert report.hosts["loop"].failed == 1 and "ssh-keyscan" in (report.hosts["loop"].error or "")
    assert not (tmp_path / "loop").exists()


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_changed_host_key_says_how_to_replace_it(sshd: Sshd, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    keytype, blob = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {keytype} {blob}\n")
    with pytest.raises(ConnectError) as err:
        open_connection(ssh_host(sshd, known=known), "~/.ssh/known_hosts", 5)
    message = str(err.value)
    assert "CHANGED" in message and f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known}" in message


@pytest.mark.sshd
@pytest.mark.timeout(60)
def test_failing_host_alongside_a_good_one(sshd: Sshd, tmp_path: Path) -> None:
    with __import__("socket").socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    hosts = [ssh_host(sshd, name="dead", port=dead_port), ssh_host(sshd, name="good")]
    report = run_fleet(hosts, planner_under(tmp_path), OPTIONS)
    assert report.hosts["good"].failed == 0 and report.hosts["good"].changed == 5
    dead = report.hosts["dead"]
    assert dead.failed == 1 and f"127.0.0.1:{dead_port}" in (dead.error or "")
    assert "refused" in (dead.error or "").lower()
    assert report.totals["failed"] == 1
