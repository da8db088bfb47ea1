"""--reboot: a host whose roles say "reboot required" after applying is rebooted, waited for on a new
boot, and converged; without --reboot the requirement is only reported."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from pdfleet.model.inventory import Host
from pdfleet.ops import runner
from pdfleet.ops.base import REBOOT_REQUIRED, FactSource, Operation, Skip
from pdfleet.ops.facts import CommandRc
from pdfleet.ops.operations import CommandOp
from pdfleet.ops.runner import RunOptions, run_fleet
from pdfleet.ops.ssh import LocalTransport, Output

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the local transport runs sudo: needs root")


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


def _planner(root: Path):
    def planner(h: Host, facts: FactSource) -> Iterable[Operation | Skip]:
        yield CommandOp(f"touch {root}/installed {root}/pending", creates=f"{root}/installed", name="driver")
        if facts.get(CommandRc(f"test -e {root}/pending")) == 0:
            yield Skip(REBOOT_REQUIRED, "driver 580.95 installed, 570.1 loaded")

    return planner


@pytest.fixture
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RebootableHost:
    (tmp_path / "boot_id").write_text("1")
    monkeypatch.setattr(runner, "REBOOT_POLL_S", 0.01)
    return RebootableHost(tmp_path)


def _host() -> Host:
    return Host(name="gpu1", groups=frozenset(), vars={}, address="127.0.0.1")


def test_without_reboot_the_requirement_is_reported(fake_host: RebootableHost) -> None:
    report = run_fleet([_host()], _planner(fake_host.root), RunOptions(), connect=lambda h, o: fake_host)
    entry = report.hosts["gpu1"]
    assert entry.changed == 1 and not entry.rebooted
    assert (fake_host.root / "boot_id").read_text() == "1"
    # the requirement appears on the next run's plan, which is what an operator sees
    again = run_fleet([_host()], _planner(fake_host.root), RunOptions(), connect=lambda h, o: fake_host)
    assert again.hosts["gpu1"].reboot_reasons == ["driver 580.95 installed, 570.1 loaded"]
    assert again.to_json()["hosts"]["gpu1"]["reboot_required"] == ["driver 580.95 installed, 570.1 loaded"]


def test_with_reboot_the_host_reboots_once_and_converges(fake_host: RebootableHost) -> None:
    options = RunOptions(reboot=True)
    report = run_fleet([_host()], _planner(fake_host.root), options, connect=lambda h, o: fake_host)
    entry = report.hosts["gpu1"]
    assert entry.error is None and entry.rebooted
    assert (fake_host.root / "boot_id").read_text() == "2"
    assert entry.reboot_reasons == []
    second = run_fleet([_host()], _planner(fake_host.root), options, connect=lambda h, o: fake_host)
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
    report = run_fleet([_host()], _planner(fake_host.root), options, connect=lambda h, o: stuck)
    assert report.totals["failed"] == 1
    assert "did not come back from reboot" in (report.hosts["gpu1"].error or "")
