"""The runner's behaviour on real shells (this machine through LocalTransport): plan, apply,
idempotence, check mode, handlers, waves, failure isolation, the JSON report, atomic uploads, and
--reboot (a host whose roles say "reboot required" after applying is rebooted, waited for on a new
boot, and converged; without --reboot the requirement is only reported)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdfleet.errors import ConnectError
from pdfleet.model.inventory import Host
from pdfleet.ops import runner
from pdfleet.ops.base import REBOOT_REQUIRED, Change, FactSource, Handler, Operation, Run, Skip, Upload
from pdfleet.ops.files import Directory, File, FileState
from pdfleet.ops.runner import CommandError, RunOptions, execute, run_fleet
from pdfleet.ops.ssh import LocalTransport, Output

pytestmark = [
    pytest.mark.procs,
    pytest.mark.skipif(os.geteuid() != 0, reason="uploads install files owned by root: needs root"),
]


def host(name: str) -> Host:
    return Host(name=name, groups=frozenset(), vars={}, address="127.0.0.1")


def local(h: Host, options: RunOptions) -> LocalTransport:
    return LocalTransport(h.name)


def tree_planner(root: Path):
    """Directories and files (one secret) under `root/<host>`."""

    def planner(h: Host, facts: FactSource) -> Iterable[Operation | Skip]:
        base = root / h.name
        yield Directory(str(base), mode="0750")
        yield File(str(base / "app.conf"), "port=8100\n", mode="0640")
        yield File(str(base / "keys.env"), "API_KEY=sk-very-secret\n", mode="0600", secret=True)
        yield File(str(base / "limits.conf"), "* soft memlock unlimited\n")
        yield Directory(str(base / "cache"), mode="0700")
        yield Skip("gpu driver", "no NVIDIA GPU on PCI bus")

    return planner


class CountingTransport(LocalTransport):
    """This machine as a host, counting the commands sent to it (the runner's round trips)."""

    sent: dict[str, int] = {}

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
        CountingTransport.sent[self.name] = CountingTransport.sent.get(self.name, 0) + 1
        return super().run(cmd, sudo, timeout)


def test_a_converged_host_costs_one_fact_batch(tmp_path: Path) -> None:
    """Planning gathers every operation's facts in one remote command; a converged host gets no other."""
    hosts = [host("h1"), host("h2")]
    first = run_fleet(hosts, tree_planner(tmp_path), RunOptions(), connect=local)
    assert first.totals["changed"] == 10
    CountingTransport.sent = {}
    second = run_fleet(
        hosts, tree_planner(tmp_path), RunOptions(), connect=lambda h, o: CountingTransport(h.name)
    )
    assert second.totals == {"ok": 10, "changed": 0, "skipped": 2, "failed": 0}
    assert CountingTransport.sent == {"h1": 1, "h2": 1}


def test_apply_then_converged(tmp_path: Path) -> None:
    events: list[tuple[str, str]] = []
    hosts = [host("h1"), host("h2")]
    json_path = tmp_path / "out" / "report.json"
    first = run_fleet(
        hosts,
        tree_planner(tmp_path),
        RunOptions(json_path=json_path),
        progress=lambda h, m: events.append((h, m)),
        connect=local,
    )
    assert first.totals == {"ok": 0, "changed": 10, "skipped": 2, "failed": 0}
    conf = tmp_path / "h1" / "app.conf"
    assert conf.read_text() == "port=8100\n" and oct(conf.stat().st_mode & 0o777) == "0o640"
    assert oct((tmp_path / "h1").stat().st_mode & 0o777) == "0o750"
    assert (tmp_path / "h2" / "limits.conf").read_text() == "* soft memlock unlimited\n"
    assert oct((tmp_path / "h2" / "cache").stat().st_mode & 0o777) == "0o700"
    assert not list(tmp_path.glob("h1/.*pdfleet-tmp"))  # staged files renamed into place
    data = json.loads(json_path.read_text())
    assert set(data) == {"hosts", "totals"}
    assert set(data["hosts"]["h1"]) == {"ok", "changed", "skipped", "failed", "changes", "error"}
    assert "sk-very-secret" not in json_path.read_text()
    assert {c["op"] for c in data["hosts"]["h1"]["changes"]} >= {f"file {conf}"}
    assert any(h == "h1" and "changed=5" in m for h, m in events)

    second = run_fleet(hosts, tree_planner(tmp_path), RunOptions(), connect=local)
    assert second.totals == {"ok": 10, "changed": 0, "skipped": 2, "failed": 0}
    assert all(h.changes == [] for h in second.hosts.values())

    # drift: mode-only change is repaired with chmod, nothing else changes
    conf.chmod(0o644)
    third = run_fleet([host("h1")], tree_planner(tmp_path), RunOptions(), connect=local)
    assert third.totals["changed"] == 1
    assert third.hosts["h1"].changes == [{"op": f"file {conf}", "diff": "mode 0644 → 0640"}]
    assert oct(conf.stat().st_mode & 0o777) == "0o640"


def test_check_mode_changes_nothing_and_reports_diffs(tmp_path: Path) -> None:
    report = run_fleet([host("h1")], tree_planner(tmp_path), RunOptions(check=True), connect=local)
    assert not (tmp_path / "h1").exists()
    assert report.check and report.totals["changed"] == 5 and report.totals["failed"] == 0
    diffs = {c["op"]: c["diff"] for c in report.hosts["h1"].changes}
    assert "+port=8100" in diffs[f"file {tmp_path}/h1/app.conf"]
    assert "sk-very-secret" not in json.dumps(report.to_json())


@dataclass(frozen=True)
class Step(Operation):
    """A test operation: always one change running `cmd`, with notify/starts_unit/flush."""

    label: str
    cmd: str
    notify: tuple[Handler, ...] = ()
    starts_unit: str | None = None
    flush: tuple[Handler, ...] = ()

    def describe(self) -> str:
        return f"step {self.label}"

    def plan(self, facts: FactSource) -> list[Change]:
        return [
            Change(self.describe(), self.label, (Run(self.cmd),), self.notify, self.starts_unit, self.flush)
        ]


def test_handlers_run_once_reload_first_and_skip_restart_of_started_unit(tmp_path: Path) -> None:
    log = tmp_path / "log"
    reload = Handler("daemon-reload", (Run(f"echo reload >> {log}"),))
    restart_a = Handler("restart a", (Run(f"echo restart-a >> {log}"),), unit="a.service")
    restart_b = Handler("restart b", (Run(f"echo restart-b >> {log}"),), unit="b.service")

    def planner(h: Host, facts: FactSource) -> Iterable[Operation]:
        yield Step("unit a", f"echo write-a >> {log}", notify=(reload, restart_a))
        yield Step("env a", f"echo env-a >> {log}", notify=(restart_a,))
        yield Step("unit b", f"echo write-b >> {log}", notify=(reload, restart_b))
        # b is started in this run: it needs the pending reload first, and no restart afterwards
        yield Step("start b", f"echo start-b >> {log}", starts_unit="b.service", flush=(reload,))

    report = run_fleet([host("h1")], planner, RunOptions(), connect=local)
    assert report.totals == {"ok": 0, "changed": 4, "skipped": 0, "failed": 0}
    assert log.read_text().split() == ["write-a", "env-a", "write-b", "reload", "start-b", "restart-a"]


def test_one_host_failure_never_stops_another(tmp_path: Path) -> None:
    def connect(h: Host, options: RunOptions) -> LocalTransport:
        if h.name == "down":
            raise ConnectError("cannot connect to down (127.0.0.1:1): Connection refused")
        return LocalTransport(h.name)

    def planner(h: Host, facts: FactSource) -> Iterable[Operation]:
        yield Step("first", f"echo {h.name} >> {tmp_path}/first")
        if h.name == "broken":
            yield Step("explode", "echo boom >&2; exit 7")
        yield Step("last", f"echo {h.name} >> {tmp_path}/last")

    hosts = [host("down"), host("broken"), host("good")]
    report = run_fleet(hosts, planner, RunOptions(), connect=connect)
    assert report.hosts["down"].failed == 1 and "Connection refused" in (report.hosts["down"].error or "")
    broken = report.hosts["broken"]
    assert broken.failed == 1 and broken.changed == 1
    assert broken.error is not None and "step explode" in broken.error and "exited 7: boom" in broken.error
    assert report.hosts["good"].failed == 0 and report.hosts["good"].changed == 2
    assert (tmp_path / "last").read_text() == "good\n"  # broken stopped at its failure
    assert report.totals["failed"] == 2


def test_failure_message_includes_diagnostics(tmp_path: Path) -> None:
    class Diag(Step):
        def plan(self, facts: FactSource) -> list[Change]:
            return [
                Change(
                    "start x", "start", (Run("exit 3", on_fail="echo journal line 1; echo journal line 2"),)
                )
            ]

    report = run_fleet([host("h1")], lambda h, f: [Diag("x", "")], RunOptions(), connect=local)
    error = report.hosts["h1"].error or ""
    assert "exited 3" in error and "journal line 1\njournal line 2" in error


def test_planner_error_fails_only_that_host(tmp_path: Path) -> None:
    def planner(h: Host, facts: FactSource) -> Iterable[Operation]:
        if h.name == "bad":
            yield Directory(str(tmp_path / "f"))  # a file exists there
        yield File(str(tmp_path / f"{h.name}.txt"), "x")

    (tmp_path / "f").write_text("not a dir")
    report = run_fleet([host("bad"), host("ok")], planner, RunOptions(), connect=local)
    assert report.hosts["bad"].failed == 1 and "expected a directory" in (report.hosts["bad"].error or "")
    assert not (tmp_path / "bad.txt").exists()  # nothing applied on a host whose plan failed
    assert (tmp_path / "ok.txt").read_text() == "x"


def test_serial_waves_apply_one_host_at_a_time(tmp_path: Path) -> None:
    log = tmp_path / "log"

    def planner(h: Host, facts: FactSource) -> Iterable[Operation]:
        yield Step("work", f"echo start-{h.name} >> {log}; sleep 0.2; echo end-{h.name} >> {log}")

    hosts = [host("a"), host("b"), host("c")]
    report = run_fleet(hosts, planner, RunOptions(serial=1), connect=local)
    assert report.totals["changed"] == 3
    assert log.read_text().split() == ["start-a", "end-a", "start-b", "end-b", "start-c", "end-c"]


def test_op_reading_a_file_written_earlier_in_the_run_plans_against_the_planned_content(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "limits.conf"

    def planner(h: Host, facts: FactSource) -> Iterable[Operation]:
        yield File(str(conf), "a=1\nb=2\n", mode="0640")
        yield File(str(conf), "a=1\nb=2\n", mode="0640")  # the content planned above: nothing to do
        yield File(str(conf), "a=1\nb=2\nc=3\n", mode="0640")  # diffed against the planned content

    check = run_fleet([host("h1")], planner, RunOptions(check=True), connect=local)
    assert check.totals == {"ok": 1, "changed": 2, "skipped": 0, "failed": 0}
    last = check.hosts["h1"].changes[-1]["diff"]
    assert "+c=3" in last and "+a=1" not in last and not last.startswith("create")
    first = run_fleet([host("h1")], planner, RunOptions(), connect=local)
    assert first.totals["changed"] == 2
    assert conf.read_text() == "a=1\nb=2\nc=3\n" and oct(conf.stat().st_mode & 0o777) == "0o640"


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


# --- --reboot ------------------------------------------------------------------------------------


class RebootableHost(LocalTransport):
    """This machine standing in for a host whose reboot loads the new driver (no real reboot)."""

    def __init__(self, root: Path) -> None:
        super().__init__("gpu1")
        self.root = root

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
        if cmd == runner.BOOT_ID:
            return Output(0, (self.root / "boot_id").read_text(), "")
        if cmd == "systemctl reboot":
            boots = int((self.root / "boot_id").read_text()) + 1
            (self.root / "boot_id").write_text(str(boots))
            (self.root / "pending").unlink(missing_ok=True)  # the new module is loaded now
            return Output(0, "", "")
        return super().run(cmd, sudo=sudo, timeout=timeout)


@dataclass(frozen=True)
class InstallDriver(Operation):
    """Stands in for a driver package: once installed, its module loads only after a reboot."""

    root: Path

    def describe(self) -> str:
        return "driver"

    def plan(self, facts: FactSource) -> list[Change]:
        if facts.get(FileState(f"{self.root}/installed")) is not None:
            return []
        touch = Run(f"touch {self.root}/installed {self.root}/pending")
        return [Change(self.describe(), "install driver 580.95", (touch,))]


def _planner(root: Path):
    def planner(h: Host, facts: FactSource) -> Iterable[Operation | Skip]:
        yield InstallDriver(root)
        if facts.get(FileState(f"{root}/pending")) is not None:
            yield Skip(REBOOT_REQUIRED, "driver 580.95 installed, 570.1 loaded")

    return planner


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RebootableHost:
    (tmp_path / "boot_id").write_text("1")
    monkeypatch.setattr(runner, "REBOOT_POLL_S", 0.01)
    return RebootableHost(tmp_path)


def test_without_reboot_the_requirement_is_reported(fake_host: RebootableHost) -> None:
    report = run_fleet([host("gpu1")], _planner(fake_host.root), RunOptions(), connect=lambda h, o: fake_host)
    entry = report.hosts["gpu1"]
    assert entry.changed == 1 and not entry.rebooted
    assert (fake_host.root / "boot_id").read_text() == "1"
    # the requirement appears on the next run's plan, which is what an operator sees
    again = run_fleet([host("gpu1")], _planner(fake_host.root), RunOptions(), connect=lambda h, o: fake_host)
    assert again.hosts["gpu1"].reboot_reasons == ["driver 580.95 installed, 570.1 loaded"]
    assert again.to_json()["hosts"]["gpu1"]["reboot_required"] == ["driver 580.95 installed, 570.1 loaded"]


def test_with_reboot_the_host_reboots_once_and_converges(fake_host: RebootableHost) -> None:
    options = RunOptions(reboot=True)
    report = run_fleet([host("gpu1")], _planner(fake_host.root), options, connect=lambda h, o: fake_host)
    entry = report.hosts["gpu1"]
    assert entry.error is None and entry.rebooted
    assert (fake_host.root / "boot_id").read_text() == "2"
    assert entry.reboot_reasons == []
    second = run_fleet([host("gpu1")], _planner(fake_host.root), options, connect=lambda h, o: fake_host)
    assert second.totals["changed"] == 0 and not second.hosts["gpu1"].rebooted
    assert (fake_host.root / "boot_id").read_text() == "2", "a converged host is not rebooted again"


def test_a_host_that_never_comes_back_fails_alone(fake_host: RebootableHost) -> None:
    class NeverBack(RebootableHost):
        def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
            if cmd == "systemctl reboot":
                return Output(0, "", "")  # the boot id never changes
            return super().run(cmd, sudo=sudo, timeout=timeout)

    stuck = NeverBack(fake_host.root)
    options = RunOptions(reboot=True, reboot_timeout=0.1)
    report = run_fleet([host("gpu1")], _planner(fake_host.root), options, connect=lambda h, o: stuck)
    assert report.totals["failed"] == 1
    assert "did not come back from reboot" in (report.hosts["gpu1"].error or "")
