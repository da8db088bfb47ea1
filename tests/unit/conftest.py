"""Fixtures shared by every tests/unit package: an OpenSSH sshd on 127.0.0.1 for `@pytest.mark.sshd` tests
(own host key, own config, own key pair), used by the ops SSH tests and the `invoke verify` tests; a real
systemd for `@pytest.mark.systemd` tests (the unit-health fact and its readers).

And the `procs` marker, kept true: a test that starts a process (subprocess, fork, spawn; seen by an
audit hook, in its fixtures too) fails unless its file is marked `pytestmark = pytest.mark.procs` (sshd
and systemd tests count as marked). The run ends with a `procs:` line: how many tests start processes
and what they cost, against the others."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter

from pdfleet.bench.procs import free_port, wait_http, wait_port
from pdfleet.lab.cgroups import remove_cgroup, systemd_hierarchies
from tests.unit.helpers import Sshd, SystemdUnits, UserSystemd

SSHD = "/usr/sbin/sshd"
SYSTEMD = "/lib/systemd/systemd"


def _ensure_sshd() -> str | None:
    """None when sshd is usable, else the reason to skip."""
    if os.geteuid() != 0:
        return "sshd tests need root (sshd must switch users and read its host key)"
    if not Path(SSHD).exists() and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "openssh-server"],
            env=env,
            capture_output=True,
            timeout=600,
            check=False,
        )
    if not Path(SSHD).exists():
        return f"{SSHD} not found and `apt-get install -y openssh-server` did not provide it"
    return None


@contextlib.contextmanager
def _running_sshd(work: Path, extra_config: str = "") -> Iterator[Sshd]:
    """`sshd -D -e -f CONFIG` on a free loopback port, its keys and config in `work`."""
    host_key, client_key = work / "host_ed25519", work / "client_ed25519"
    for key in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (work / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    port = free_port()
    config = work / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {work}/sshd.pid\n"
        f"AuthorizedKeysFile {work}/authorized_keys\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "Subsystem sftp internal-sftp\nLogLevel ERROR\nMaxStartups 100\n" + extra_config
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation directory
    log = (work / "sshd.log").open("wb")
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, timeout=10.0, proc=proc)
        host_pub = host_key.with_suffix(".pub")
        known = work / "known_hosts"
        keytype, blob = host_pub.read_text().split()[:2]
        known.write_text(f"[127.0.0.1]:{port} {keytype} {blob}\n")
        yield Sshd(port, client_key, known, host_pub, work)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """An sshd on loopback for the whole session."""
    reason = _ensure_sshd()
    if reason:
        pytest.skip(reason)
    with _running_sshd(tmp_path_factory.mktemp("sshd")) as running:
        yield running


def _systemctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`systemctl --user ARGS` against the private instance."""
    return subprocess.run(
        ["systemctl", "--user", *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def _own_cgroups(name: str) -> list[Path]:
    """A new cgroup `name` in each cgroup hierarchy a systemd would use, created empty."""
    groups = [hierarchy / name for hierarchy in systemd_hierarchies()]
    for group in groups:
        group.mkdir()
    return groups


@pytest.fixture(scope="session")
def systemd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UserSystemd]:
    """A real systemd (this machine's, as a user instance) for the session. Not being PID 1, it refuses to
    start unless /run/systemd/system exists; a private mount namespace gives it one without touching
    this machine's /run."""
    if os.geteuid() != 0:
        pytest.skip("systemd tests need root (a private mount namespace)")
    if not Path(SYSTEMD).exists() or not shutil.which("unshare") or not shutil.which("systemctl"):
        pytest.skip(f"systemd tests need {SYSTEMD}, systemctl and unshare")
    work = tmp_path_factory.mktemp("systemd")
    runtime, units, bin_dir = work / "run", work / "config/systemd/user", work / "bin"
    for path in (runtime, units, bin_dir):
        path.mkdir(mode=0o700, parents=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "XDG_CONFIG_HOME": str(work / "config")}
    wrapper = bin_dir / "systemctl"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("systemctl")} --user "$@"\n')
    wrapper.chmod(0o755)
    # its own cgroup in every hierarchy: a manager takes the cgroup it starts in as its root and moves every
    # process there into its init.scope, which at the root cgroup would be every process of this machine
    groups = _own_cgroups(f"pdfleet-test-{uuid.uuid4().hex[:12]}")
    join = "".join(f"echo $$ > {g}/cgroup.procs && " for g in groups)
    boot = f"{join}mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && exec {SYSTEMD} --user"
    log = (work / "systemd.log").open("wb")
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", boot],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        # is-system-running says "offline" outside the namespace; the manager's own property does not
        while _systemctl(env, "show", "-p", "SystemState", "--value").stdout.strip() not in (
            "running",
            "degraded",
        ):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"systemd --user did not start: {(work / 'systemd.log').read_text()[-300:]}")
            time.sleep(0.1)
        path = f"{bin_dir}:{env['PATH']}"
        yield UserSystemd(units, bin_dir, {"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"], "PATH": path})
    finally:
        try:
            _systemctl(env, "exit")
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        for group in groups:
            remove_cgroup(group)


HEALTH_UNIT = """[Service]
ExecStart=/usr/bin/python3 -m http.server --bind 127.0.0.1 --directory {root} {port}
"""
FAILING_UNIT = "[Service]\nExecStart=/bin/false\n"


@pytest.fixture(scope="session")
def systemd_units(systemd: UserSystemd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SystemdUnits]:
    """Real units in the private systemd: one healthy (and an alias of it), one failed."""
    root = tmp_path_factory.mktemp("web")
    (root / "health").write_text("ok")
    # bound but never listening: refused for the whole session, and no other test's server can take it
    closed_sock = socket.socket()
    closed_sock.bind(("127.0.0.1", 0))
    port, closed = free_port(), closed_sock.getsockname()[1]
    (systemd.units_dir / "web.service").write_text(HEALTH_UNIT.format(root=root, port=port))
    (systemd.units_dir / "down.service").write_text(FAILING_UNIT)
    (systemd.units_dir / "www.service").symlink_to("web.service")
    env = {**os.environ, **systemd.env}
    _systemctl(env, "daemon-reload")
    _systemctl(env, "start", "web.service", "down.service")  # down.service fails: that is its job
    wait_http(f"http://127.0.0.1:{port}/health", timeout=20)
    try:
        yield SystemdUnits(port, closed)
    finally:
        _systemctl(env, "stop", "web.service")
        closed_sock.close()


@pytest.fixture(scope="session")
def systemd_sshd(systemd: UserSystemd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """An sshd whose sessions' `systemctl` is the private systemd's (sshd's SetEnv), so a command sent
    over SSH asks that systemd as a host's command asks its own."""
    reason = _ensure_sshd()
    if reason:
        pytest.skip(reason)
    path = f"{systemd.bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    extra = f"SetEnv PATH={path} XDG_RUNTIME_DIR={systemd.env['XDG_RUNTIME_DIR']}\n"
    with _running_sshd(tmp_path_factory.mktemp("systemd-sshd"), extra) as running:
        yield running


# audit events of a new process: subprocess (asyncio's too), os.fork (multiprocessing), os.posix_spawn
SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec"}
)
PROCS_MARKERS = ("procs", "sshd", "systemd")
SPAWNS = pytest.StashKey[list[str]]()


def pytest_configure(config: pytest.Config) -> None:
    """Record every process a test starts (an audit hook cannot be removed: the list is reset per test)."""
    spawns: list[str] = []
    config.stash[SPAWNS] = spawns

    def hook(event: str, args: Sequence[object]) -> None:
        if event in SPAWN_EVENTS:
            spawns.append(f"{event} {str(args[0] if args else '')[:80]}")

    sys.addaudithook(hook)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.config.stash[SPAWNS].clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A passing test that started a process (its fixtures included) without the marker fails, naming it."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    spawns = item.config.stash[SPAWNS]
    marked = any(item.get_closest_marker(m) for m in PROCS_MARKERS)
    if call.when == "call" and report.passed and spawns and not marked:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started a process ({spawns[0]}; {len(spawns)} in all) but its file is not "
            "marked: add `pytestmark = pytest.mark.procs` (see tests/unit/conftest.py)"
        )


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """How many tests start processes and what they cost (setup + call + teardown, summed over workers)."""
    tests: dict[bool, set[str]] = {True: set(), False: set()}
    seconds: dict[bool, float] = {True: 0.0, False: 0.0}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if isinstance(rep, pytest.TestReport) and rep.nodeid.startswith("tests/unit/"):
                marked = any(m in rep.keywords for m in PROCS_MARKERS)
                tests[marked].add(rep.nodeid)
                seconds[marked] += rep.duration
    if tests[True] or tests[False]:
        terminalreporter.write_line(
            f"procs: {len(tests[True])} tests start processes, {seconds[True]:.1f} s; "
            f"{len(tests[False])} others, {seconds[False]:.1f} s (summed over workers)"
        )
