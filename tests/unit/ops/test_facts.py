"""Fact parsers on realistic command outputs (pyinfra's tests/facts style)."""

from __future__ import annotations

import pytest

from pdfleet.ops.facts import (
    AptHolds,
    AptPackages,
    CommandRc,
    DirectoryState,
    FactError,
    FileContent,
    FileState,
    GroupEntry,
    HostFacts,
    PasswdEntry,
    PathInfo,
    PipList,
    SysctlValue,
    SystemdUnitState,
    UserGroups,
    parse_dpkg_query,
    parse_getent_group,
    parse_getent_passwd,
    parse_pip_list_json,
    parse_proc_modules,
    parse_stat,
    parse_sysctl,
    parse_systemctl_show,
)
from pdfleet.ops.ssh import LocalTransport

DPKG = (
    "curl\tii \t7.88.1-10+deb12u14\n"
    "libc6\tii \t2.36-9+deb12u14\n"
    "nvidia-driver\thi \t550.127.05-1\n"
    "openssh-server\tii \t1:9.2p1-2+deb12u10\n"
    "oldpkg\trc \t1.0-1\n"
    "halfpkg\tiU \t2.0-1\n"
    "libfoo:amd64\tii \t3.1\n"
)


def test_dpkg_query_keeps_installed_and_held_drops_removed() -> None:
    assert parse_dpkg_query(DPKG) == {
        "curl": "7.88.1-10+deb12u14",
        "libc6": "2.36-9+deb12u14",
        "nvidia-driver": "550.127.05-1",
        "openssh-server": "1:9.2p1-2+deb12u10",
        "libfoo": "3.1",
    }


def test_apt_packages_named_reports_missing_as_none() -> None:
    fact = AptPackages(("curl", "oldpkg", "nosuch"))
    assert fact.parse(DPKG, 1) == {"curl": "7.88.1-10+deb12u14", "oldpkg": None, "nosuch": None}
    assert "dpkg-query -W -f" in fact.command() and "nosuch" in fact.command()


def test_apt_holds() -> None:
    assert AptHolds().parse("nvidia-driver\nlibnvidia-compute:amd64\n", 0) == frozenset(
        {"nvidia-driver", "libnvidia-compute"}
    )
    with pytest.raises(FactError):
        AptHolds().parse("", 100)


def test_stat_regular_file_with_sha() -> None:
    out = (
        "regular file|644|root|root|1267\n"
        "fbb009546a886aff175d5515b702dd415fbc24bdee63f1ddaf7931c922cb3566  /etc/passwd\n"
    )
    assert parse_stat(out) == PathInfo(
        "file",
        "0644",
        "root",
        "root",
        1267,
        "fbb009546a886aff175d5515b702dd415fbc24bdee63f1ddaf7931c922cb3566",
    )


def test_stat_variants() -> None:
    assert parse_stat("directory|1777|root|root|4096\n") == PathInfo(
        "directory", "1777", "root", "root", 4096
    )
    empty = parse_stat(
        "regular empty file|600|pdfleet|pdfleet|0\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  /etc/x\n"
    )
    assert empty is not None and empty.kind == "file" and empty.mode == "0600" and empty.size == 0
    assert parse_stat("symbolic link|777|root|root|9\n").kind == "link"  # type: ignore[union-attr]
    assert parse_stat("") is None
    with pytest.raises(FactError):
        parse_stat("garbage\n")


def test_file_state_on_this_machine(tmp_path) -> None:
    """The real command and parser agree with Python's view of a file."""
    path = tmp_path / "f.txt"
    path.write_text("hello\n")
    path.chmod(0o640)
    facts = HostFacts(LocalTransport())
    info = facts.get(FileState(str(path)))
    assert info is not None and info.kind == "file" and info.mode == "0640" and info.size == 6
    assert info.sha256 == "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    assert facts.get(FileState(str(tmp_path / "absent"))) is None
    assert facts.get(FileState(str(tmp_path))).kind == "directory"  # type: ignore[union-attr]
    assert facts.get(FileContent(str(path))) == "hello\n"
    assert facts.get(FileContent(str(path), limit=3)) is None
    assert facts.get(FileContent(str(tmp_path / "absent"))) is None


def test_host_facts_caches_one_command_per_fact(tmp_path) -> None:
    counter = tmp_path / "count"
    transport = LocalTransport()
    facts = HostFacts(transport)
    fact = CommandRc(f"echo x >> {counter}; exit 3")
    assert facts.get(fact) == 3
    assert facts.get(CommandRc(f"echo x >> {counter}; exit 3")) == 3  # equal args → same cache key
    assert counter.read_text() == "x\n"
    assert facts.gathered == 1


SYSTEMCTL_RUNNING = """LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
"""
SYSTEMCTL_MISSING = """LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=
"""


def test_systemctl_show() -> None:
    state = parse_systemctl_show(SYSTEMCTL_RUNNING)
    assert state.exists and state.enabled and state.running and state.sub_state == "running"
    missing = parse_systemctl_show(SYSTEMCTL_MISSING)
    assert not missing.exists and not missing.enabled and not missing.running
    static = parse_systemctl_show(
        "LoadState=loaded\nActiveState=failed\nSubState=failed\nUnitFileState=static\n"
    )
    assert static.enabled and not static.running
    with pytest.raises(FactError):
        SystemdUnitState("x.service").parse("System has not been booted with systemd", 1)


def test_sysctl() -> None:
    assert parse_sysctl("4096\t131072\t33554432\n", 0) == "4096 131072 33554432"
    assert parse_sysctl("60\n", 0) == "60"
    assert parse_sysctl("", 255) is None
    assert SysctlValue("vm.swappiness").command() == "sysctl -n -- vm.swappiness"


PROC_MODULES = """nvidia_uvm 1540096 0 - Live 0x0000000000000000 (POE)
nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)
nvidia 62738432 3 nvidia_uvm,nvidia_peermem, Live 0x0000000000000000 (POE)
ib_core 458752 8 rdma_ucm,ib_uverbs,nvidia_peermem, Live 0x0000000000000000
br_netfilter 32768 0 - Live 0x0000000000000000
"""


def test_proc_modules() -> None:
    assert parse_proc_modules(PROC_MODULES) == frozenset(
        {"nvidia_uvm", "nvidia_peermem", "nvidia", "ib_core", "br_netfilter"}
    )


def test_getent() -> None:
    assert parse_getent_passwd("pdfleet:x:998:998::/var/lib/pdfleet:/usr/sbin/nologin\n", 0) == PasswdEntry(
        "pdfleet", 998, 998, "", "/var/lib/pdfleet", "/usr/sbin/nologin"
    )
    assert parse_getent_passwd("", 2) is None
    assert parse_getent_group("video:x:44:pdfleet,ops\n", 0) == GroupEntry("video", 44, ("pdfleet", "ops"))
    assert parse_getent_group("sudo:x:27:\n", 0) == GroupEntry("sudo", 27, ())
    assert parse_getent_group("", 2) is None
    with pytest.raises(FactError):
        parse_getent_passwd("broken:line\n", 0)
    assert UserGroups("ops").parse("ops sudo video\n", 0) == frozenset({"ops", "sudo", "video"})
    assert UserGroups("nosuch").parse("", 1) is None


PIP_JSON = (
    '[{"name": "aiohttp", "version": "3.14.5"}, {"name": "nixl", "version": "0.3.1"}, '
    '{"name": "Jinja2", "version": "3.1.6"}, {"name": "vllm_router", "version": "0.1.17"}, '
    '{"name": "pdfleet", "version": "0.1.0", "editable_project_location": "/work/main"}]'
)


def test_pip_list_json() -> None:
    listed = parse_pip_list_json(PIP_JSON)
    assert listed == {
        "aiohttp": "3.14.5",
        "nixl": "0.3.1",
        "jinja2": "3.1.6",
        "vllm-router": "0.1.17",
        "pdfleet": "0.1.0",
    }
    assert PipList("/opt/v").parse("", 3) is None
    with pytest.raises(FactError):
        PipList("/opt/v").parse("Traceback", 1)


def test_pip_list_fact_on_a_real_venv() -> None:
    """PipList's command works against this project's own venv."""
    import sys

    venv = sys.prefix
    value = HostFacts(LocalTransport()).get(PipList(venv))
    assert value is not None and "pytest" in value
    assert HostFacts(LocalTransport()).get(PipList("/nonexistent/venv")) is None


def test_directory_state_follows_links(tmp_path) -> None:
    real = tmp_path / "data"
    real.mkdir(mode=0o750)
    (tmp_path / "opt").symlink_to(real)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    facts = HostFacts(LocalTransport())
    linked = facts.get(DirectoryState(str(tmp_path / "opt")))
    assert linked is not None and linked.kind == "directory" and linked.mode == "0750"
    assert facts.get(DirectoryState(str(tmp_path / "dangling"))).kind == "link"  # type: ignore[union-attr]
    assert facts.get(DirectoryState(str(tmp_path / "absent"))) is None
    assert facts.get(FileState(str(tmp_path / "opt"))).kind == "link"  # type: ignore[union-attr]
