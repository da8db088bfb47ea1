"""Each lab host's container starts in a cgroup of its own (pdfleet.lab.cgroups)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pdfleet.lab.cgroups import fresh_host_cgroups, host_cgroups, joined

pytestmark = pytest.mark.procs  # one test runs the joining shell


def _hierarchy(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.procs").touch()
    return path


def test_a_hybrid_layout_gives_the_systemd_and_unified_hierarchies(tmp_path: Path) -> None:
    systemd, unified = _hierarchy(tmp_path / "systemd"), _hierarchy(tmp_path / "unified")
    _hierarchy(tmp_path / "cpu")  # a controller's hierarchy: the container's systemd does not use it
    assert host_cgroups("lab-d1", tmp_path) == [
        systemd / "pdfleet-lab/lab-d1",
        unified / "pdfleet-lab/lab-d1",
    ]


def test_a_v2_layout_gives_the_root_and_none_gives_nothing(tmp_path: Path) -> None:
    v2 = _hierarchy(tmp_path / "v2")
    assert host_cgroups("lab-p1", v2) == [v2 / "pdfleet-lab/lab-p1"]
    assert host_cgroups("lab-p1", tmp_path / "absent") == []


def test_hosts_get_distinct_groups_and_a_leftover_group_is_emptied(tmp_path: Path) -> None:
    _hierarchy(tmp_path / "systemd")
    (tmp_path / "systemd/pdfleet-lab/lab-d1/payload/system.slice").mkdir(parents=True)
    (d1,) = fresh_host_cgroups("lab-d1", tmp_path)
    (p1,) = fresh_host_cgroups("lab-p1", tmp_path)
    assert d1 != p1 and d1.is_dir() and p1.is_dir()
    assert not (d1 / "payload").exists()


def test_the_command_joins_every_group_then_runs_with_the_same_pid(tmp_path: Path) -> None:
    groups = [_hierarchy(tmp_path / "a"), _hierarchy(tmp_path / "b")]
    proc = subprocess.run(joined(groups, ["sh", "-c", "echo $$"]), capture_output=True, text=True, check=True)
    pid = proc.stdout.strip()
    assert [(g / "cgroup.procs").read_text().strip() for g in groups] == [pid, pid]
    assert joined([], ["true"]) == ["true"]
