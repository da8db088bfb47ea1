"""The lab's hosts: read from the lab inventory, checked to be on the lab network and nameable."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.lab.control import _remove_hosts, find_host
from pdfleet.lab.paths import LabPaths
from pdfleet.lab.state import HostRecord, LabState
from pdfleet.lab.system import ProcessRef
from pdfleet.model.inventory import load_inventory
from tests.unit.lab.helpers import LAB_YML, REPO, lab_of


def test_lab_inventory_has_the_agreed_hosts_and_connection_vars() -> None:
    inv = load_inventory(LAB_YML)
    assert {h.name: (h.address, sorted(h.groups)) for h in inv.hosts.values()} == {
        "lab-gw": ("198.18.0.10", ["gateway", "monitoring"]),
        "lab-colo1": ("198.18.0.11", ["colocated"]),
        "lab-colo2": ("198.18.0.12", ["colocated"]),
        "lab-p1": ("198.18.0.21", ["prefill"]),
        "lab-d1": ("198.18.0.31", ["decode"]),
    }
    for host in inv.hosts.values():
        assert host.user == "ops"
        assert host.key_file == str(LabPaths().key_file)
        assert host.known_hosts_file == str(LabPaths().known_hosts)
    hosts = lab_of(LAB_YML).hosts()
    assert [h.name for h in hosts] == ["lab-gw", "lab-colo1", "lab-colo2", "lab-p1", "lab-d1"]


def test_same_host_inventory_uses_the_lab_hosts_as_lab_yml_declares_them() -> None:
    lab = {h.name: h for h in load_inventory(LAB_YML).hosts.values()}
    same = load_inventory(REPO / "inventory" / "lab-same-host.yml")
    for host in same.hosts.values():
        assert host.name in lab
        assert (host.address, host.user, host.key_file) == (
            lab[host.name].address,
            lab[host.name].user,
            lab[host.name].key_file,
        )
    assert same.hosts["lab-p1"].in_group("prefill") and same.hosts["lab-p1"].in_group("decode")


def _inventory(tmp_path: Path, hosts: str) -> Path:
    path = tmp_path / "inv.yml"
    path.write_text("all:\n  hosts:\n" + hosts)
    return path


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ("    a:\n      ansible_host: 10.0.0.5\n", "must be a host address in 198.18.0.0/24"),
        ("    a:\n      ansible_host: 198.18.0.1\n", "other than the bridge's"),
        ("    a:\n      ansible_host: lab-a\n", "is not an IPv4 address"),
        ("    a:\n      ansible_host: 198.18.0.5\n    b:\n      ansible_host: 198.18.0.5\n", "also a's"),
        ("    a-very-long-name:\n      ansible_host: 198.18.0.5\n", "at most 12 characters"),
    ],
)
def test_lab_refuses_hosts_off_the_lab_network(tmp_path: Path, hosts: str, message: str) -> None:
    lab = lab_of(_inventory(tmp_path, hosts), LabPaths(tmp_path))
    with pytest.raises(ValidationError, match=message):
        lab.hosts()


def test_find_host_names_the_known_hosts() -> None:
    lab = lab_of(LAB_YML)
    assert find_host(lab, "lab-p1").address == "198.18.0.21"
    with pytest.raises(ValidationError, match="lab hosts: lab-gw, lab-colo1, lab-colo2, lab-p1, lab-d1"):
        find_host(lab, "lab-x")


# a stand-in for a container's nspawn: it takes SHUTDOWN_S to shut down after SIGTERM, like a host's systemd
# stopping its services
SHUTDOWN_S = 3.0
HOSTS = 4


@pytest.mark.procs
def test_removing_hosts_asks_every_host_to_shut_down_before_waiting_for_any(tmp_path: Path) -> None:
    """Four hosts taking 3 s each to shut down are gone in about 3 s, not the 12 s or more of one after the
    other (the bound leaves 6 s for a loaded machine), and the state forgets them."""
    script = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (time.sleep({SHUTDOWN_S}), sys.exit(0)))\n"
        "print('ready', flush=True)\n"
        "signal.pause()\n"
    )
    host = [sys.executable, "-c", script]
    procs = [subprocess.Popen(host, stdout=subprocess.PIPE, text=True) for _ in range(HOSTS)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its trap is set
        paths = LabPaths(tmp_path)
        state = LabState(paths.state_file)
        names = [f"lab-t{i}" for i in range(len(procs))]
        for name, proc in zip(names, procs, strict=True):
            state.hosts[name] = HostRecord(nspawn=ProcessRef.of(proc.pid), init=None)
        started = time.monotonic()
        _remove_hosts(paths, state, names, lambda _: None)
        took = time.monotonic() - started
        print(f"{HOSTS} hosts removed in {took:.2f} s")
        assert all(proc.poll() == 0 for proc in procs), [p.poll() for p in procs]  # shut down, not killed
        assert took < (HOSTS - 1) * SHUTDOWN_S, f"{took:.1f} s: the hosts shut down one after the other"
        assert state.hosts == {}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
