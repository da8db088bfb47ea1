"""Lab hosts: systemd-nspawn containers booting real systemd from the image, one overlay each."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko

from pdfleet.lab.cgroups import fresh_host_cgroups, host_cgroups, joined, remove_cgroup
from pdfleet.lab.network import host_veth, remove_link
from pdfleet.lab.paths import BRIDGE, LOGIN_USER, NETWORK, LabPaths
from pdfleet.lab.sshkeys import read_host_public_keys, write_host_keys
from pdfleet.lab.state import HostRecord
from pdfleet.lab.system import (
    LabError,
    ProcessRef,
    atomic_write,
    children,
    is_mounted,
    namespace_pid,
    run,
    start_detached,
)


@dataclass(frozen=True)
class LabHost:
    """A lab host as inventory/lab.yml declares it."""

    name: str
    address: str
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostDirs:
    """A host's directories on the control machine: overlay upper/work, merged root, logs."""

    base: Path

    @property
    def upper(self) -> Path:
        return self.base / "upper"

    @property
    def work(self) -> Path:
        return self.base / "work"

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def console_log(self) -> Path:
        return self.base / "console.log"

    @property
    def image_key_file(self) -> Path:
        return self.base / "image-key"

    @property
    def etc_ssh_upper(self) -> Path:
        """Host keys as written into the overlay's upper dir (read without the mount)."""
        return self.upper / "etc/ssh"


def dirs(paths: LabPaths, name: str) -> HostDirs:
    """The directories of the host called `name` under the lab's state root."""
    return HostDirs(paths.host_dir(name))


def network_file(address: str) -> str:
    """systemd-networkd config for the container's host0: a static address and no gateway."""
    return (
        "# pdfleet lab: static address on the lab bridge; no gateway, so nothing else is reachable.\n"
        "[Match]\nName=host0\n\n"
        f"[Network]\nAddress={address}/{NETWORK.prefixlen}\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\nDHCP=no\n"
    )


def hosts_file(hosts: Sequence[LabHost]) -> str:
    """/etc/hosts naming every lab host by its lab address (no DNS in the lab)."""
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in hosts]
    return "\n".join(lines) + "\n"


def mount_overlay(hd: HostDirs, image_root: Path) -> None:
    """Mount the host's overlay (image below, the host's own upper dir above) unless already mounted."""
    for path in (hd.upper, hd.work, hd.root):
        path.mkdir(parents=True, exist_ok=True)
    if not is_mounted(hd.root):
        opts = f"lowerdir={image_root},upperdir={hd.upper},workdir={hd.work}"
        run(["mount", "-t", "overlay", "overlay", "-o", opts, str(hd.root)])


def unmount_overlay(hd: HostDirs) -> None:
    """Unmount the host's overlay if mounted (lazily when something still holds it)."""
    if is_mounted(hd.root) and run(["umount", str(hd.root)], check=False).returncode != 0:
        run(["umount", "-l", str(hd.root)], check=False)


def write_host_files(hd: HostDirs, host: LabHost, all_hosts: Sequence[LabHost], client_pub: str) -> None:
    """Give a host its identity (once) and its lab config (every up) through the mounted overlay."""
    root = hd.root
    if not (hd.etc_ssh_upper / "ssh_host_ed25519_key.pub").exists():
        atomic_write(root / "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
        write_host_keys(root / "etc/ssh", host.name)
    atomic_write(root / "etc/hostname", host.name + "\n")
    atomic_write(root / "etc/hosts", hosts_file(all_hosts))
    atomic_write(root / "etc/systemd/network/10-pdfleet-lab.network", network_file(host.address))
    # Lingering keeps the login user's systemd manager running from boot on. Without it, each login
    # after the last one ended starts user@UID.service and, UserStopDelaySec later, stops it; on this
    # kind of machine that stop hangs (the cgroup kill fails) and a login arriving meanwhile waits in
    # pam_systemd until the 90 s stop timeout: the ~100 s stalls of provision and the slow first verify.
    linger = root / "var/lib/systemd/linger"
    linger.mkdir(parents=True, exist_ok=True)
    atomic_write(linger / LOGIN_USER, "")
    home = root / "home" / LOGIN_USER
    uid, gid = _ids(root, LOGIN_USER)
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    atomic_write(ssh_dir / "authorized_keys", client_pub, 0o600)
    for path in (ssh_dir, ssh_dir / "authorized_keys"):
        os.chown(path, uid, gid)


def _ids(root: Path, user: str) -> tuple[int, int]:
    """uid/gid of a user as the image's /etc/passwd has them (not the control machine's)."""
    for line in (root / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return int(fields[2]), int(fields[3])
    raise LabError(f"the lab image has no user {user!r}; delete {root.parent} and run lab.up again.")


def host_public_keys(hd: HostDirs) -> list[str]:
    """The host's SSH host keys, read from its overlay on disk (not learned over the network)."""
    return read_host_public_keys(hd.etc_ssh_upper)


def nspawn_command(hd: HostDirs, name: str, bridge: str = BRIDGE) -> list[str]:
    """systemd-nspawn booting the overlay on the lab bridge, unregistered (no machined), console logged."""
    return [
        "systemd-nspawn",
        "--boot",
        f"--directory={hd.root}",
        f"--machine={name}",
        "--register=no",
        "--keep-unit",
        f"--network-bridge={bridge}",
        "--resolv-conf=off",
        "--timezone=off",
        "--link-journal=no",
        "--console=read-only",
    ]


def start_host(hd: HostDirs, host: LabHost) -> HostRecord:
    """Boot the container detached; returns the nspawn process and the container's init."""
    Path("/run/systemd/nspawn").mkdir(parents=True, exist_ok=True)
    remove_link(host_veth(host.name))  # a veth left by a killed container would block the name
    groups = fresh_host_cgroups(host.name)
    proc = start_detached(joined(groups, nspawn_command(hd, host.name)), hd.console_log)
    nspawn = ProcessRef.of(proc.pid)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = hd.console_log.read_text(errors="replace").strip().splitlines()[-10:]
            raise LabError(
                f"systemd-nspawn for {host.name} exited ({proc.returncode}); "
                f"see {hd.console_log}:\n" + "\n".join(tail)
            )
        for child in children(proc.pid):
            if namespace_pid(child) == 1:
                return HostRecord(nspawn=nspawn, init=ProcessRef.of(child))
        time.sleep(0.05)
    raise LabError(f"the container for {host.name} did not start its init within 15 s; see {hd.console_log}.")


def unrecorded_container(hd: HostDirs) -> HostRecord | None:
    """A container on this host's root that state.json does not know (lab.up killed before saving it)."""
    want = f"--directory={hd.root}"
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"systemd-nspawn") and want.encode() in argv:
            pid = int(entry.name)
            inits = [c for c in children(pid) if namespace_pid(c) == 1]
            return HostRecord(nspawn=ProcessRef.of(pid), init=ProcessRef.of(inits[0]) if inits else None)
    return None


def host_running(rec: HostRecord | None) -> bool:
    """Whether both the nspawn supervisor and the container's init are alive."""
    return bool(rec and rec.nspawn and rec.init and rec.nspawn.alive() and rec.init.alive())


def request_power_off(rec: HostRecord | None) -> None:
    """Ask the container for an orderly shutdown (nspawn turns SIGTERM into one) without waiting: hosts
    asked together shut down together, so taking the lab down costs the slowest host, not their sum."""
    if rec is not None and rec.nspawn and rec.nspawn.alive():
        rec.nspawn.send(signal.SIGTERM)


def stop_host(rec: HostRecord | None, name: str, timeout: float = 20.0) -> None:
    """Power the container off (an orderly shutdown, see request_power_off), killing what remains."""
    if rec is not None:
        if rec.nspawn and rec.nspawn.alive():
            request_power_off(rec)  # again when already asked: nspawn repeats the same request to init
            rec.nspawn.wait_gone(timeout)
        # An init orphaned by a killed nspawn, or one that ignored the shutdown: killing a PID
        # namespace's init kills every process in it.
        if rec.init:
            rec.init.stop(5.0, first=signal.SIGKILL)
        if rec.nspawn:
            rec.nspawn.stop(5.0, first=signal.SIGKILL)
    for group in host_cgroups(name):
        remove_cgroup(group)
    remove_link(host_veth(name))


def wipe_host(hd: HostDirs) -> None:
    """Delete a stopped host's overlay and logs."""
    unmount_overlay(hd)
    if hd.base.exists():
        shutil.rmtree(hd.base)


def tcp_open(address: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections there."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_tcp(address: str, port: int, timeout: float) -> bool:
    """Poll until a port accepts connections or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if tcp_open(address, port, 0.5):
            return True
        time.sleep(0.2)
    return False


def ssh_client(address: str, key_file: Path, known_hosts: Path, timeout: float = 10.0) -> paramiko.SSHClient:
    """A logged-in SSH client as the lab user, with strict host-key checking against the lab's file."""
    client = paramiko.SSHClient()
    client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        address,
        username=LOGIN_USER,
        key_filename=str(key_file),
        look_for_keys=False,
        allow_agent=False,
        timeout=timeout,
        banner_timeout=timeout,
        auth_timeout=timeout,
    )
    return client


def ssh_run(
    address: str, key_file: Path, known_hosts: Path, command: str, timeout: float = 20.0
) -> tuple[int, str, str]:
    """Run one command on a lab host over SSH: (exit code, stdout, stderr)."""
    client = ssh_client(address, key_file, known_hosts, timeout)
    try:
        _, stdout, stderr = client.exec_command(command, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace")
        return stdout.channel.recv_exit_status(), out, err
    finally:
        client.close()


def ssh_problem(address: str, key_file: Path, known_hosts: Path, timeout: float = 15.0) -> str | None:
    """None when the host accepts the lab login with a verified host key, else what went wrong."""
    try:
        rc = ssh_run(address, key_file, known_hosts, "true", timeout)[0]
    except (OSError, paramiko.SSHException, EOFError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if rc == 0 else f"`true` exited {rc}"


def login_evidence(hd: HostDirs, rec: HostRecord | None, lines: int = 12) -> str:
    """What a host that refuses the lab login says about it: its console's tail, and sshd's journal and
    the login user's key files as seen inside the container (through nsenter, no login needed)."""
    parts = []
    if hd.console_log.exists():
        tail = hd.console_log.read_text(errors="replace").strip().splitlines()[-lines:]
        parts.append("console:\n  " + "\n  ".join(tail))
    if rec is not None and rec.init is not None and rec.init.alive():
        inside = (
            f"journalctl --no-pager -q -n {lines} -u ssh.service; "
            f"ls -ln /home/{LOGIN_USER} /home/{LOGIN_USER}/.ssh; "
            "echo system: $(systemctl is-system-running); systemctl list-jobs --no-pager | head -n 8; "
            "systemctl --failed --no-pager --no-legend; "
            "cat /run/nologin 2>/dev/null"
        )
        proc = run(
            ["nsenter", f"--target={rec.init.pid}", "--mount", "--pid", "--", "sh", "-c", inside], check=False
        )
        parts.append("inside:\n  " + "\n  ".join((proc.stdout + proc.stderr).strip().splitlines()))
    return "\n".join(parts)


def ssh_ok(address: str, key_file: Path, known_hosts: Path, timeout: float = 15.0) -> bool:
    """Whether the host accepts the lab login with a verified host key."""
    return ssh_problem(address, key_file, known_hosts, timeout) is None
