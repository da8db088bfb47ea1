"""lab up / down / status: bring the whole lab to a state, and say what state it is in."""

from __future__ import annotations

import ipaddress
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.lab import hosts as labhosts
from pdfleet.lab import mirrors
from pdfleet.lab.capacity import available_mib, memory_problem
from pdfleet.lab.hosts import LabHost
from pdfleet.lab.image import default_recipe, ensure_image, prune_images
from pdfleet.lab.model_mirror import build_lab_models
from pdfleet.lab.network import ensure_bridge, link_exists, remove_link
from pdfleet.lab.paths import (
    BRIDGE,
    BRIDGE_ADDRESS,
    NETWORK,
    LabPaths,
    apt_mirror_url,
    models_mirror_url,
    pypi_mirror_url,
)
from pdfleet.lab.pki import ensure_lab_pki
from pdfleet.lab.sshkeys import ensure_client_key, known_hosts_lines
from pdfleet.lab.state import HostRecord, LabState
from pdfleet.lab.system import LabError, Progress, atomic_write, exclusive, preflight, quiet_progress
from pdfleet.model.inventory import load_inventory

SSH_TIMEOUT = 90.0
MAX_NAME = 12  # "vb-" + name must fit a 15-character interface name


@dataclass(frozen=True)
class Lab:
    """One lab: where its state lives, the clone it serves, and the inventory naming its hosts."""

    paths: LabPaths
    inventory: Path
    apt_packages: tuple[str, ...]  # what the roles install from apt: the lab's apt mirror carries them

    def hosts(self) -> list[LabHost]:
        """The lab hosts from the inventory, checked to be on the lab network and nameable."""
        inv = load_inventory(self.inventory)
        found: list[LabHost] = []
        seen: dict[str, str] = {}
        for host in inv.hosts.values():
            where = f"{self.inventory}: host {host.name}"
            try:
                addr = ipaddress.IPv4Address(host.address)
            except ValueError:
                raise ValidationError(
                    f"{where}: ansible_host {host.address!r} is not an IPv4 address"
                ) from None
            if addr not in NETWORK or str(addr) in (
                BRIDGE_ADDRESS,
                str(NETWORK.network_address),
                str(NETWORK.broadcast_address),
            ):
                raise ValidationError(
                    f"{where}: ansible_host {addr} must be a host address in {NETWORK} "
                    f"other than the bridge's {BRIDGE_ADDRESS}"
                )
            if str(addr) in seen:
                raise ValidationError(f"{where}: address {addr} is also {seen[str(addr)]}'s")
            if len(host.name) > MAX_NAME:
                raise ValidationError(f"{where}: lab host names are at most {MAX_NAME} characters")
            seen[str(addr)] = host.name
            found.append(LabHost(host.name, str(addr), tuple(sorted(host.groups))))
        if not found:
            raise ValidationError(f"{self.inventory}: declares no hosts")
        return found


@dataclass(frozen=True)
class UpResult:
    """What lab.up brought up: the hosts, the host wheel version served, apt packages Debian lacks."""

    hosts: tuple[LabHost, ...]
    host_version: str
    apt_unavailable: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class BuildResult:
    """What lab.build left ready: the host wheel version the pypi mirror serves, apt packages Debian lacks."""

    host_version: str
    apt_unavailable: tuple[str, ...]
    seconds: float


@dataclass(frozen=True)
class _Caches:
    """The image and mirrors lab.up boots hosts from."""

    image_key: str
    image: Path
    apt_unavailable: tuple[str, ...]
    host_version: str


def build(lab: Lab, progress: Progress = quiet_progress) -> BuildResult:
    """Build or reuse the image and both mirrors, as lab.up does first, and boot nothing: on a fresh
    machine that is minutes of downloads, which can run while something else does (the unit tests)."""
    started = time.monotonic()
    preflight()
    with exclusive(progress):
        caches = _build_caches(lab, progress)
    return BuildResult(caches.host_version, caches.apt_unavailable, time.monotonic() - started)


def up(lab: Lab, progress: Progress = quiet_progress) -> UpResult:
    """Build or reuse the image and mirrors, then boot every host the inventory lists (stopping lab hosts
    it does not list) and wait until each answers SSH; refuse first when they would not fit in memory."""
    started = time.monotonic()
    preflight()
    hosts = lab.hosts()
    with exclusive(progress):
        state = LabState.load(lab.paths.state_file)
        booting = [h for h in hosts if not labhosts.host_running(state.hosts.get(h.name))]
        problem = memory_problem(str(lab.inventory), len(booting), available_mib())
        if problem:
            raise LabError(problem)
        return _up(lab, hosts, started, progress)


def _make_root(paths: LabPaths) -> None:
    """The lab's state root, readable by the mirror servers' users."""
    paths.root.mkdir(parents=True, exist_ok=True)
    paths.root.chmod(0o755)


def _build_caches(lab: Lab, progress: Progress) -> _Caches:
    """The image, the apt mirror and the pypi mirror (with this clone's host wheel), built or reused;
    under the lab lock."""
    paths = lab.paths
    _make_root(paths)
    recipe = default_recipe()
    # The wheel download needs nothing from the image, so it runs while debootstrap does.
    with ThreadPoolExecutor(max_workers=1) as pool:
        deps_future = pool.submit(mirrors.build_pypi_deps, paths, progress)
        image = ensure_image(paths.image_dir, recipe, progress)
        apt = mirrors.build_apt_mirror(paths, recipe, image, lab.apt_packages, progress)
        deps = deps_future.result()
    mirrors.populate_pypi(paths, deps)
    progress("model mirror: the lab model's revisions")
    build_lab_models(paths.models_dir)
    progress("pypi mirror: the host wheel of this clone")
    version = mirrors.refresh_host_wheel(paths)
    return _Caches(recipe.key, image, tuple(apt.unavailable), version)


def _up(lab: Lab, hosts: list[LabHost], started: float, progress: Progress) -> UpResult:
    """up, under the lab lock."""
    paths = lab.paths
    _make_root(paths)
    state = LabState.load(paths.state_file)
    _stop_unlisted(paths, state, {h.name for h in hosts}, progress)
    state.inventory = str(lab.inventory)
    caches = _build_caches(lab, progress)
    client_pub = ensure_client_key(paths.key_file)
    _ensure_pki(paths, hosts, progress)

    state.bridge = True  # recorded before creating, so a kill right after still gets it removed
    state.save()
    ensure_bridge()
    recorded = set(state.servers.values())
    for ref in mirrors.leftover_servers(paths):
        if ref not in recorded:  # started by a lab.up killed before it could record them
            ref.stop(5.0)
    for kind in mirrors.SERVERS:
        state.servers[kind] = mirrors.start_server(paths, kind, state.servers.get(kind))
        state.save()

    for host in hosts:
        _bring_up_host(lab, state, host, caches.image_key, caches.image, hosts, client_pub, progress)
    _write_known_hosts(paths, hosts)
    _wait_for_ssh(paths, state, hosts, progress)
    prune_images(paths.image_dir, keep=caches.image_key)
    return UpResult(tuple(hosts), caches.host_version, caches.apt_unavailable, time.monotonic() - started)


def _ensure_pki(paths: LabPaths, hosts: Sequence[LabHost], progress: Progress) -> None:
    """The lab CA and a certificate for the inventory's gateway hosts (their names and addresses), which
    the TLS lab profiles name as their site PKI (pdfleet.lab.pki)."""
    gateways = [h for h in hosts if "gateway" in h.groups]
    if gateways:
        names, addresses = [h.name for h in gateways], [h.address for h in gateways]
        if ensure_lab_pki(paths.tls_dir, names, addresses)[2]:
            progress(f"lab CA: a gateway certificate for {', '.join(names + addresses)} in {paths.tls_dir}")


def _bring_up_host(
    lab: Lab,
    state: LabState,
    host: LabHost,
    image_key: str,
    image: Path,
    all_hosts: Sequence[LabHost],
    client_pub: str,
    progress: Progress,
) -> None:
    """Keep a healthy host running; otherwise clear its leftovers and boot it (on a fresh image: afresh)."""
    hd = labhosts.dirs(lab.paths, host.name)
    rec = state.hosts.get(host.name) or labhosts.unrecorded_container(hd)
    recorded_key = hd.image_key_file.read_text().strip() if hd.image_key_file.exists() else None
    if recorded_key != image_key:
        if hd.base.exists():
            progress(f"{host.name}: image changed, recreating the host")
        labhosts.stop_host(rec, host.name)
        labhosts.wipe_host(hd)
        rec = None
    if labhosts.host_running(rec):
        assert rec is not None
        state.hosts[host.name] = rec
        state.save()
        labhosts.write_host_files(hd, host, all_hosts, client_pub)
        progress(f"{host.name}: already running")
        return
    if rec is not None:
        progress(f"{host.name}: clearing a dead or half-running container")
        labhosts.stop_host(rec, host.name)
    hd.base.mkdir(parents=True, exist_ok=True)
    atomic_write(hd.image_key_file, image_key + "\n")
    labhosts.mount_overlay(hd, image)
    labhosts.write_host_files(hd, host, all_hosts, client_pub)
    progress(f"{host.name}: booting at {host.address}")
    state.hosts[host.name] = labhosts.start_host(hd, host)
    state.save()


def _stop_unlisted(paths: LabPaths, state: LabState, listed: set[str], progress: Progress) -> None:
    """Remove lab hosts of an earlier lab.up that this inventory does not list (their /etc/hosts and the
    known_hosts file would no longer describe the fleet)."""
    names = set(state.hosts)
    if paths.hosts_dir.exists():
        names |= {p.name for p in paths.hosts_dir.iterdir() if p.is_dir()}
    _remove_hosts(paths, state, sorted(names - listed), progress, "not in this inventory, removing it")


def _remove_hosts(
    paths: LabPaths, state: LabState, names: Sequence[str], progress: Progress, saying: str = "stopping"
) -> None:
    """Remove several hosts: every shutdown is asked for first, then each is waited for and wiped, so the
    hosts' systemd stop their services at the same time (20-40 s one after the other for five hosts)."""
    for name in names:
        labhosts.request_power_off(state.hosts.get(name))
        labhosts.request_power_off(labhosts.unrecorded_container(labhosts.dirs(paths, name)))
    for name in names:
        progress(f"{name}: {saying}")
        _remove_host(paths, state, name)


def _remove_host(paths: LabPaths, state: LabState, name: str) -> None:
    """Stop a host (recorded or not), delete its overlay, forget it."""
    hd = labhosts.dirs(paths, name)
    labhosts.stop_host(state.hosts.get(name), name)
    labhosts.stop_host(labhosts.unrecorded_container(hd), name)
    labhosts.wipe_host(hd)
    state.hosts.pop(name, None)
    state.save()


def _write_known_hosts(paths: LabPaths, hosts: Sequence[LabHost]) -> None:
    """known_hosts from the keys in each host's overlay: nothing is trusted on first use."""
    entries = [((h.address, h.name), labhosts.host_public_keys(labhosts.dirs(paths, h.name))) for h in hosts]
    atomic_write(paths.known_hosts, known_hosts_lines(entries), 0o644)


def _wait_for_ssh(paths: LabPaths, state: LabState, hosts: Sequence[LabHost], progress: Progress) -> None:
    """Wait until every host accepts the lab login with its verified host key; a host that never does is
    reported with what its console and sshd say (the overlay, logs included, goes with lab.down)."""
    deadline = time.monotonic() + SSH_TIMEOUT
    problems = {h.name: "not tried yet" for h in hosts}
    progress(f"waiting for sshd on {', '.join(problems)}")
    while problems and time.monotonic() < deadline:
        waiting = [h for h in hosts if h.name in problems]
        # every host at once: a login is ~0.2 s of ssh, one after the other ~1 s a lab.up on a running lab
        with ThreadPoolExecutor(max_workers=len(waiting)) as pool:
            found = dict(zip(waiting, pool.map(lambda h: _login_problem(paths, h), waiting), strict=True))
        for host, problem in found.items():
            if problem is None:
                del problems[host.name]
            else:
                problems[host.name] = problem
        if problems:
            time.sleep(0.3)
    if problems:
        detail = "; ".join(
            f"{name}: {why}\n{labhosts.login_evidence(labhosts.dirs(paths, name), state.hosts.get(name))}"
            for name, why in problems.items()
        )
        raise LabError(f"lab hosts did not answer SSH within {SSH_TIMEOUT:.0f} s: {detail}")


def _login_problem(paths: LabPaths, host: LabHost) -> str | None:
    """Why the host does not take the lab login yet, or None."""
    if not labhosts.tcp_open(host.address, 22, 0.5):
        return "port 22 closed"
    return labhosts.ssh_problem(host.address, paths.key_file, paths.known_hosts)


def down(lab: Lab, purge: bool = False, progress: Progress = quiet_progress) -> None:
    """Remove what up created (containers, overlays, mounts, servers, bridge); safe to run twice.

    Caches (image, mirrors, the lab's SSH key) stay for a fast next up unless purge is set.
    """
    preflight(("ip", "mount"))
    with exclusive(progress):
        _down(lab, purge, progress)


def _down(lab: Lab, purge: bool, progress: Progress) -> None:
    """down, under the lab lock."""
    paths = lab.paths
    state = LabState.load(paths.state_file)
    names = set(state.hosts)
    if paths.hosts_dir.exists():
        names |= {p.name for p in paths.hosts_dir.iterdir() if p.is_dir()}
    _remove_hosts(paths, state, sorted(names), progress)
    for kind, ref in list(state.servers.items()):
        ref.stop(5.0)
        state.servers.pop(kind)
    for ref in mirrors.leftover_servers(paths):
        ref.stop(5.0)
    remove_link(BRIDGE)
    for path in (
        paths.known_hosts,
        paths.gateway_client_key,
        paths.gateway_admin_key,
        paths.gateway_controller_key,
    ):
        path.unlink(missing_ok=True)  # they describe hosts that no longer exist
    shutil.rmtree(paths.gateway_keys_dir, ignore_errors=True)
    shutil.rmtree(paths.run_dir, ignore_errors=True)
    state.remove()
    if purge and paths.root.exists():
        progress(f"purging caches under {paths.root}")
        shutil.rmtree(paths.root)


@dataclass(frozen=True)
class HostStatus:
    """One lab host: is its container running, does the lab login work."""

    host: LabHost
    running: bool
    ssh: bool


@dataclass(frozen=True)
class MirrorStatus:
    """One mirror server: is our process alive, does its port answer."""

    kind: str
    url: str
    running: bool
    answering: bool


@dataclass(frozen=True)
class LabStatus:
    """The whole lab as `lab.status` shows it."""

    bridge: bool
    hosts: tuple[HostStatus, ...]
    mirrors: tuple[MirrorStatus, ...]

    @property
    def healthy(self) -> bool:
        """Bridge up, every host running and reachable by SSH, every mirror answering."""
        return (
            self.bridge
            and all(h.running and h.ssh for h in self.hosts)
            and all(m.running and m.answering for m in self.mirrors)
        )


def status(lab: Lab) -> LabStatus:
    """Each host: running, address, SSH login works; each mirror: process alive and answering."""
    preflight(())
    paths = lab.paths
    state = LabState.load(paths.state_file)
    hosts = []
    for host in lab.hosts():
        running = labhosts.host_running(state.hosts.get(host.name, HostRecord()))
        ssh = (
            running
            and paths.known_hosts.exists()
            and labhosts.ssh_ok(host.address, paths.key_file, paths.known_hosts)
        )
        hosts.append(HostStatus(host, running, ssh))
    found = []
    for kind, port in mirrors.SERVERS.items():
        ref = state.servers.get(kind)
        url = {"apt": apt_mirror_url, "pypi": pypi_mirror_url, "models": models_mirror_url}[kind]()
        alive = bool(ref and ref.alive())
        found.append(MirrorStatus(kind, url, alive, alive and labhosts.tcp_open(BRIDGE_ADDRESS, port)))
    return LabStatus(link_exists(BRIDGE), tuple(hosts), tuple(found))


def find_host(lab: Lab, name: str) -> LabHost:
    """A lab host by name; an unknown name lists the known ones."""
    hosts = lab.hosts()
    for host in hosts:
        if host.name == name:
            return host
    known = ", ".join(h.name for h in hosts)
    raise ValidationError(f"no lab host {name!r} in {lab.inventory}; lab hosts: {known}")
