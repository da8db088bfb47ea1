"""The lab's own infrastructure, against real containers: SSH, identities, isolation, mirrors, down/up."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
from pathlib import Path

import paramiko
import pytest

from pdfleet.errors import ConnectError
from pdfleet.fleet.host_wheel import host_version
from pdfleet.lab.control import build, down, status
from pdfleet.lab.hosts import dirs, host_running, ssh_ok
from pdfleet.lab.mirrors import SERVERS, refresh_host_wheel
from pdfleet.lab.network import ARP_RETRANS_MS, link_exists
from pdfleet.lab.paths import BRIDGE, BRIDGE_ADDRESS, apt_mirror_url, pypi_mirror_url
from pdfleet.lab.state import LabState
from pdfleet.ops.ssh import open_connection
from tests.lab.helpers import LabHandle

# An address in TEST-NET-1: only ever looked up in the routing table, never sent a packet.
OUTSIDE = "192.0.2.1"


def test_every_host_answers_ssh_as_ops_with_sudo(lab: LabHandle) -> None:
    """pdfleet's own SSH layer logs in as ops with the lab's known_hosts, and sudo needs no password."""
    inventory = lab.inventory
    assert [h.name for h in lab.hosts] == ["lab-gw", "lab-colo1", "lab-colo2", "lab-p1", "lab-d1"]
    for host in inventory.hosts.values():
        conn = open_connection(host, str(lab.paths.known_hosts), 10.0)
        try:
            assert conn.run("id -un").stdout.strip() == "ops"
            assert conn.run("hostname").stdout.strip() == host.name
            assert conn.run("sudo -n true").rc == 0
            assert conn.run("id -u", sudo=True).stdout.strip() == "0"
        finally:
            conn.close()


def test_openssh_client_verifies_host_keys_strictly(lab: LabHandle, tmp_path: Path) -> None:
    """OpenSSH with StrictHostKeyChecking=yes accepts the lab's known_hosts and refuses an empty one."""
    host = lab.hosts[0]
    base = [
        "ssh",
        "-i",
        str(lab.paths.key_file),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
    ]
    good = subprocess.run(
        [*base, "-o", f"UserKnownHostsFile={lab.paths.known_hosts}", f"ops@{host.address}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert good.returncode == 0, good.stderr
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    bad = subprocess.run(
        [*base, "-o", f"UserKnownHostsFile={empty}", f"ops@{host.address}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0
    assert "Host key verification failed" in bad.stderr


def test_pdfleet_refuses_a_host_key_it_does_not_know(lab: LabHandle, tmp_path: Path) -> None:
    """A known_hosts entry with another host's key is a ConnectError, not a silent accept."""
    gw, other = lab.hosts[0], lab.hosts[1]
    lines = [
        line
        for line in lab.paths.known_hosts.read_text().splitlines()
        if line.split()[0].split(",")[0] == other.address
    ]
    wrong = tmp_path / "known_hosts"
    wrong.write_text("".join(f"{gw.address} {' '.join(line.split()[1:])}\n" for line in lines))
    # The inventory's pdfleet_known_hosts_file wins over the run default, so swap it on the host.
    host = dataclasses.replace(lab.inventory.hosts[gw.name], known_hosts_file=str(wrong))
    with pytest.raises(ConnectError):
        open_connection(host, str(wrong), 10.0).run("true")
    client = paramiko.SSHClient()
    client.load_host_keys(str(wrong))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        client.connect(
            gw.address,
            username="ops",
            key_filename=str(lab.paths.key_file),
            look_for_keys=False,
            allow_agent=False,
            timeout=10,
        )
    client.close()


def test_hosts_have_distinct_machine_ids_and_host_keys(lab: LabHandle) -> None:
    """Identity is per host: machine-id and SSH host keys differ, and match what known_hosts holds."""
    machine_ids, host_keys = set(), set()
    for host in lab.hosts:
        rc, out, _ = lab.ssh(host, "cat /etc/machine-id; cat /etc/ssh/ssh_host_ed25519_key.pub")
        assert rc == 0
        machine_id, key_line = out.splitlines()[:2]
        assert len(machine_id) == 32
        machine_ids.add(machine_id)
        key = " ".join(key_line.split()[:2])
        host_keys.add(key)
        assert f"{host.address},{host.name} {key}" in lab.paths.known_hosts.read_text()
    assert len(machine_ids) == len(lab.hosts)
    assert len(host_keys) == len(lab.hosts)
    image_keys = list((lab.paths.image_dir).glob("*/rootfs/etc/ssh/ssh_host_*"))
    assert image_keys == [], "the shared image must not carry host keys"


def test_each_host_boots_in_a_cgroup_of_its_own(lab: LabHandle) -> None:
    """Every container's init runs under pdfleet-lab/<host>: hosts sharing one cgroup shared every unit's
    cgroup too, and one host's boot failed another's systemd-user-sessions (219/CGROUP)."""
    state = LabState.load(lab.paths.state_file)
    for host in lab.hosts:
        init = state.hosts[host.name].init
        assert init is not None
        lines = Path(f"/proc/{init.pid}/cgroup").read_text().splitlines()
        systemd_line = next(ln for ln in lines if ":name=systemd:" in ln or ln.startswith("0::"))
        assert f"/pdfleet-lab/{host.name}/" in systemd_line, (host.name, systemd_line)


def test_hosts_reach_the_mirrors_and_nothing_else(lab: LabHandle) -> None:
    """No default route (v4 or v6); the bridge address serves apt and PyPI; other lab hosts answer."""
    for host in lab.hosts:
        rc, out, _ = lab.ssh(host, "ip -4 route show default; ip -6 route show default")
        assert rc == 0 and out.strip() == "", f"{host.name} has a default route: {out}"
        rc, _, err = lab.ssh(host, f"ip route get {OUTSIDE}")
        assert rc != 0 and "unreachable" in err.lower()
        rc, out, _ = lab.ssh(host, f"curl -fsS {apt_mirror_url()}Release && curl -fsS {pypi_mirror_url()}")
        assert rc == 0, out
        assert "Origin: pdfleet-lab" in out and 'href="pdfleet/"' in out and 'href="vllm-router/"' in out
    rc, _, _ = lab.ssh(
        lab.hosts[0], f"curl -fsS --max-time 5 -o /dev/null http://{lab.hosts[1].address}:22 || test $? -ne 7"
    )
    assert rc == 0, "lab hosts reach each other on the bridge"


def test_mirror_servers_listen_on_the_bridge_only(lab: LabHandle) -> None:
    """The mirror servers are bound to 198.18.0.1, not to loopback or every address."""
    import socket

    for port in SERVERS.values():
        with socket.create_connection((BRIDGE_ADDRESS, port), timeout=2):
            pass
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass


def test_hosts_install_from_the_mirrors(lab: LabHandle) -> None:
    """A host installs a package from the apt mirror and the clone's host wheel from the PyPI mirror."""
    host = lab.hosts[-1]
    version = host_version()
    assert refresh_host_wheel(lab.paths) == version
    script = (
        f"echo 'deb [trusted=yes] {apt_mirror_url()} ./' | sudo tee /etc/apt/sources.list.d/labtest.list"
        " >/dev/null && sudo apt-get update -q >/dev/null && sudo apt-get install -y -q jq >/dev/null"
        " && jq --version"
        " && rm -rf /tmp/labtest-venv && python3 -m venv /tmp/labtest-venv"
        f" && /tmp/labtest-venv/bin/pip install -q --no-deps --index-url {pypi_mirror_url()}"
        f" --trusted-host {BRIDGE_ADDRESS} pdfleet && /tmp/labtest-venv/bin/pip show pdfleet"
    )
    try:
        rc, out, err = lab.ssh(host, script, timeout=180)
        assert rc == 0, err
        assert "jq-" in out
        assert f"Version: {version}" in out
    finally:
        lab.ssh(host, "sudo rm -f /etc/apt/sources.list.d/labtest.list; rm -rf /tmp/labtest-venv")


def test_status_reports_a_healthy_lab(lab: LabHandle) -> None:
    report = status(lab.lab)
    assert report.healthy, report
    assert {m.kind for m in report.mirrors} == {"apt", "pypi", "models"}


def test_up_again_keeps_running_hosts(lab: LabHandle) -> None:
    """A second up on a running lab restarts nothing."""
    before = LabState.load(lab.paths.state_file).hosts
    lab.up()
    after = LabState.load(lab.paths.state_file).hosts
    assert {n: r.init for n, r in before.items()} == {n: r.init for n, r in after.items()}


def test_build_on_a_running_lab_reuses_the_caches_and_touches_no_host(lab: LabHandle) -> None:
    """lab.build (what ./dev test runs beside the unit tests) finds image and mirrors cached, boots and
    stops nothing, and leaves the mirrors serving this clone's host wheel."""
    before = LabState.load(lab.paths.state_file)
    said: list[str] = []
    result = build(lab.lab, progress=said.append)
    after = LabState.load(lab.paths.state_file)
    assert {n: r.init for n, r in before.hosts.items()} == {n: r.init for n, r in after.hosts.items()}
    assert after.servers == before.servers and status(lab.lab).healthy
    for cache in ("image", "pypi deps", "apt mirror"):
        assert any(m.startswith(cache) and m.endswith(": cached") for m in said), said
    assert result.host_version == host_version()


@pytest.mark.parametrize("victim", ["nspawn", "init"])
def test_up_recovers_after_kill_9(lab: LabHandle, victim: str) -> None:
    """kill -9 of a container's nspawn (its init is orphaned) or of its init; up brings it back."""
    host = lab.hosts[-1]
    _, machine_id, _ = lab.ssh(host, "cat /etc/machine-id")
    rec = LabState.load(lab.paths.state_file).hosts[host.name]
    ref = rec.nspawn if victim == "nspawn" else rec.init
    assert ref is not None
    os.kill(ref.pid, signal.SIGKILL)
    ref.wait_gone(10)
    assert not host_running(LabState.load(lab.paths.state_file).hosts[host.name])
    assert not status(lab.lab).healthy
    lab.up()
    rc, out, _ = lab.ssh(host, "cat /etc/machine-id; systemctl is-system-running --wait")
    assert rc in (0, 1)  # "degraded" is rc 1; the host is up either way
    assert out.splitlines()[0] == machine_id.strip(), "the host keeps its disk across a crash"
    assert status(lab.lab).healthy


def test_down_twice_is_clean_then_up_several_times_in_a_row_logs_in_at_once(lab: LabHandle) -> None:
    """down removes containers, mounts, servers and bridge; a second down is a no-op; up restores. Up right
    after down, twice in a row (the first, the up after that double down): every host takes the login as
    soon as up returns, because sshd starts only after systemd-user-sessions has removed /run/nologin (else
    PAM hangs up). One test, two down/up rounds (two tests took three)."""
    _down_twice_clean(lab)
    for round_ in range(2):
        if round_:
            down(lab.lab)
        lab.up()
        _logins_wait_for_user_sessions(lab)  # the first login after up
        assert all(ssh_ok(h.address, lab.paths.key_file, lab.paths.known_hosts) for h in lab.hosts)
    # the new bridge's ARP probes: a host that is down fails a connection in 3 x 250 ms, not 3 s
    retrans = int(Path(f"/proc/sys/net/ipv4/neigh/{BRIDGE}/retrans_time_ms").read_text())
    assert abs(retrans - ARP_RETRANS_MS) <= 10, retrans  # kept in jiffies: 252 on a 250 Hz kernel


def _down_twice_clean(lab: LabHandle) -> None:
    """down, checking it left nothing behind, then down again (safe twice)."""
    state = LabState.load(lab.paths.state_file)
    refs = [r for rec in state.hosts.values() for r in (rec.nspawn, rec.init) if r]
    refs += list(state.servers.values())
    down(lab.lab)
    assert not link_exists(BRIDGE)
    assert not any(r.alive() for r in refs)
    mounts = Path("/proc/self/mounts").read_text()
    assert str(lab.paths.hosts_dir) not in mounts
    assert not lab.paths.state_file.exists()
    assert not any(dirs(lab.paths, h.name).base.exists() for h in lab.hosts)
    assert not any(link_exists(f"vb-{h.name}") for h in lab.hosts)
    down(lab.lab)  # safe twice
    assert not link_exists(BRIDGE)


def _logins_wait_for_user_sessions(lab: LabHandle) -> None:
    """Every host's sshd is ordered after systemd-user-sessions and started after it was up."""
    probe = (
        "systemctl show -p After --value ssh.service; "
        "systemctl show -p ActiveEnterTimestampMonotonic --value systemd-user-sessions.service; "
        "systemctl show -p ExecMainStartTimestampMonotonic --value ssh.service"
    )
    for host in lab.hosts:
        rc, out, err = lab.ssh(host, probe)
        assert rc == 0, err
        after, sessions_up, sshd_start = out.split("\n")[:3]
        assert "systemd-user-sessions.service" in after.split()
        assert 0 < int(sessions_up) <= int(sshd_start), f"{host.name}: sshd started before logins"


def test_login_user_lingers_so_logins_never_wait_for_its_manager(lab: LabHandle) -> None:
    """The lab user's systemd manager runs from boot and stays: a login never starts or waits for it."""
    for host in lab.hosts:
        check = "loginctl show-user ops -p Linger --value; systemctl is-active user@1000.service"
        rc, out, err = lab.ssh(host, check)
        assert rc == 0, err
        assert out.split() == ["yes", "active"], (host.name, out)
