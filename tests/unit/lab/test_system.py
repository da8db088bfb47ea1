"""Preflight and process records of the lab's control side."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdfleet.lab import system
from pdfleet.lab.system import LabError, ProcessRef, preflight

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_preflight_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system.sys, "platform", "darwin")
    with pytest.raises(LabError, match="needs Linux"):
        preflight()
    monkeypatch.setattr(system.sys, "platform", "linux")
    monkeypatch.setattr(system.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        preflight()
    monkeypatch.setattr(system.os, "geteuid", lambda: 0)
    monkeypatch.setattr(system.shutil, "which", lambda tool: None if tool == "debootstrap" else "/bin/x")
    with pytest.raises(LabError, match="apt-get install -y debootstrap"):
        preflight()


def test_process_ref_tells_a_live_process_from_a_gone_one() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ref = ProcessRef.of(proc.pid)
    assert ref is not None and ref.alive()
    assert not ProcessRef(proc.pid, ref.start_time + 1).alive()  # a recycled PID is not ours
    ref.stop(5.0)
    assert not ref.alive()
    proc.wait()
