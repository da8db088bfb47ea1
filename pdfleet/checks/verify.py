"""`invoke verify`: testinfra checks of every host over SSH, as a host × check table and JUnit XML.

The checks live in pdfleet.checks.hosts (one module per concern) and are run programmatically with pytest.
A VerifyPlugin hands them the validated profile and the fleet's topology, parametrises them over the selected
hosts, connects testinfra's `ssh://` backend through an ssh_config generated from the inventory
(strict host-key checking against the inventory's known_hosts) and records every outcome. A
check that does not apply to a host skips with the reason; the run fails on any failed check.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.roles import ManagedUnit, instance_unit
from pdfleet.fleet.topology import Topology
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.ops.base import Fact

HOST_CHECKS_DIR = Path(__file__).resolve().parent / "hosts"
# The checks are product modules named for their concern (gpu.py, not test_gpu.py); this ini makes pytest
# collect them, and keeps the clone's own pytest settings (addopts, testpaths) out of the run.
HOST_CHECKS_INI = "[pytest]\npython_files = *.py\n"
PASS, FAIL, SKIP = "pass", "fail", "skip"
T = TypeVar("T")


@dataclass(frozen=True)
class VerifyOptions:
    """What the operator asked for on the command line."""

    junit: Path | None = None
    rdma_bandwidth: bool = False
    checks: str | None = None  # pytest -k expression, to run a subset
    connect_timeout: int = 10
    default_known_hosts: str = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome on one host, with the skip reason or failure message."""

    host: str
    check: str
    outcome: str  # pass / fail / skip
    detail: str = ""


_SSH_CONFIG_UNSAFE = re.compile(r'[\s"\x00-\x1f\x7f]')


def _ssh_config_safe(host: str, what: str, value: str) -> None:
    """Refuse a value that would split an ssh_config line (a newline could add e.g. a ProxyCommand)."""
    if _SSH_CONFIG_UNSAFE.search(value):
        raise ValidationError(f"inventory host {host}: {what} {value!r} contains whitespace or quotes")


def ssh_config(hosts: Sequence[Host], default_known_hosts: str, control_dir: Path, timeout: int) -> str:
    """An ssh_config with one block per inventory host: its address, user, port, key, known_hosts.

    StrictHostKeyChecking yes: an unknown or changed host key is a failure, never trusted on use.
    """
    blocks = []
    for host in hosts:
        known = Path(host.known_hosts_file or default_known_hosts).expanduser()
        checked = {
            "inventory host name": host.name,
            "ansible_host": host.address,
            "ansible_user": host.user,
            "known_hosts file": str(known),
            "ansible_ssh_private_key_file": host.key_file or "",
        }
        for what, value in checked.items():
            _ssh_config_safe(host.name, what, value)
        lines = [
            f"Host {host.name}",
            f"  HostName {host.address}",
            f"  User {host.user}",
            f"  Port {host.port}",
            f"  UserKnownHostsFile {known}",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            f"  ConnectTimeout {timeout}",
            "  ControlMaster auto",
            f"  ControlPath {control_dir}/%C",
            "  ControlPersist 120",
        ]
        if host.key_file:
            lines += [f"  IdentityFile {Path(host.key_file).expanduser()}", "  IdentitiesOnly yes"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def host_units(topology: Topology, host: Host) -> list[ManagedUnit]:
    """The vLLM pool units a host runs (used when no role list is at hand)."""
    return [instance_unit(i) for i in topology.on_host(host.name)]


def pd_pairs(hosts: Sequence[Host]) -> list[tuple[Host, Host]]:
    """(prefill, decode) host pairs on different hosts, for the RDMA bandwidth check."""
    prefill = [h for h in hosts if h.in_group("prefill")]
    decode = [h for h in hosts if h.in_group("decode")]
    return [(p, d) for p in prefill for d in decode if p.name != d.name]


_IB_BW_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def parse_ib_write_bw(stdout: str) -> float | None:
    """BW average [Gb/sec] from `ib_write_bw --report_gbits` (perftest: #bytes #iterations BW peak
    BW average MsgRate), the last data row; None when the run printed no result."""
    value = None
    for line in stdout.splitlines():
        m = _IB_BW_ROW.match(line)
        if m:
            value = float(m[4])
    return value


def env_pairs(env_text: str) -> list[tuple[str, str]]:
    """(name, value) of each KEY=value line of systemd env file text, comments skipped, quotes removed."""
    pairs = []
    for line in env_text.splitlines():
        name, sep, value = line.partition("=")
        if sep and not name.strip().startswith("#"):
            pairs.append((name.strip(), value.strip().strip("\"'")))
    return pairs


def secret_values(env_text: str) -> list[str]:
    """Values of KEY/TOKEN/SECRET/PASSWORD variables in env files (the things that must not leak)."""
    return [
        value
        for name, value in env_pairs(env_text)
        if re.search(r"KEY|TOKEN|SECRET|PASSW", name.upper()) and len(value) >= 8
    ]


def _host_and_check(nodeid: str) -> tuple[str, str]:
    """`gpu.py::test_persistence_on[lab-p1]` → ("lab-p1", "gpu/persistence_on")."""
    path, _, rest = nodeid.partition("::")
    func, _, param = rest.partition("[")
    module = Path(path).stem.removeprefix("test_")
    host = param.rstrip("]")
    return host if host and host != "NOTSET" else "-", f"{module}/{func.removeprefix('test_')}"


def _detail(report: pytest.TestReport | pytest.CollectReport) -> str:
    """One line saying why: the skip reason, or the failed assertion's own message."""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    lines = []
    for line in text.splitlines():
        if line.startswith("assert "):  # pytest's rewritten-assert explanation follows the message
            break
        lines.append(line)
    message = " ".join(" ".join(lines).split()).removeprefix("AssertionError: ").removeprefix("Failed: ")
    return message[:400]


def _ssh_error(target: Any) -> str:
    """ "" when the host answers over SSH, else ssh's own last error line (refused, host key, ...)."""
    try:
        target.run("true")
    except RuntimeError as exc:  # testinfra's ssh backend raises when ssh itself exits 255
        result = exc.args[0] if exc.args else None
        lines = (getattr(result, "stderr", "") or str(exc)).strip().splitlines()
        return lines[-1] if lines else "ssh failed"
    return ""


@dataclass(eq=False)  # pluggy keeps plugins in sets: hash by identity
class VerifyPlugin:
    """pytest plugin giving the host checks the profile, the topology and an SSH target per host."""

    profile: Profile
    topology: Topology
    hosts: list[Host]
    options: VerifyOptions
    ssh_config_path: Path
    units_for: Callable[[Host], list[ManagedUnit]] | None = None
    results: list[CheckResult] = field(default_factory=list)
    _targets: dict[str, Any] = field(default_factory=dict)
    _reachable: dict[str, str] = field(default_factory=dict)  # host → "" or the SSH error

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "pd_host" in metafunc.fixturenames:
            metafunc.parametrize("pd_host", self.hosts, ids=[h.name for h in self.hosts])
        if "pd_pair" in metafunc.fixturenames:
            pairs = pd_pairs(self.hosts)
            metafunc.parametrize("pd_pair", pairs, ids=[f"{p.name}->{d.name}" for p, d in pairs])

    def target_for(self, host: Host) -> Any:
        """The testinfra host for an inventory host (ssh:// backend, sudo unless root), cached."""
        if host.name not in self._targets:
            import testinfra

            self._targets[host.name] = testinfra.get_host(
                f"ssh://{host.name}",
                ssh_config=str(self.ssh_config_path),
                sudo=host.user != "root",
                timeout=self.options.connect_timeout,
            )
        return self._targets[host.name]

    @pytest.fixture
    def verify(self) -> VerifyPlugin:
        return self

    def units(self, host: Host) -> list[ManagedUnit]:
        """The units the host should run: from the roles when given, else its vLLM pools."""
        return self.units_for(host) if self.units_for else host_units(self.topology, host)

    @pytest.fixture
    def target(self, pd_host: Host) -> Any:
        target = self.target_for(pd_host)
        if pd_host.name not in self._reachable:
            self._reachable[pd_host.name] = _ssh_error(target)
        error = self._reachable[pd_host.name]
        if error:
            pytest.fail(
                f"cannot reach {pd_host.name} ({pd_host.address}:{pd_host.port}) over SSH: {error}", False
            )
        return target

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            host, check = _host_and_check(report.nodeid)
            outcome = PASS if report.passed else SKIP if report.skipped else FAIL
            self.results.append(CheckResult(host, check, outcome, "" if report.passed else _detail(report)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.results.append(CheckResult("-", f"collect {report.nodeid}", FAIL, _detail(report)))

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Leave out the bandwidth check unless --rdma-bandwidth was given."""
        if self.options.rdma_bandwidth:
            return
        dropped = [i for i in items if "pd_pair" in getattr(i, "fixturenames", ())]
        if dropped:
            items[:] = [i for i in items if i not in dropped]
            config.hook.pytest_deselected(items=dropped)


@dataclass(frozen=True)
class VerifyRun:
    """Every check result of a run and pytest's exit code."""

    results: list[CheckResult]
    exit_code: int

    @property
    def failed(self) -> list[CheckResult]:
        """The failed checks."""
        return [r for r in self.results if r.outcome == FAIL]


def _close_masters(config: Path, hosts: Sequence[Host]) -> None:
    """Stop the ControlMaster connections the run opened (ControlPersist would keep them a while)."""
    for host in hosts:
        subprocess.run(
            ["ssh", "-F", str(config), "-O", "exit", host.name], capture_output=True, timeout=10, check=False
        )


def run_verify(
    profile: Profile,
    topology: Topology,
    hosts: Sequence[Host],
    options: VerifyOptions,
    units_for: Callable[[Host], list[ManagedUnit]] | None = None,
) -> VerifyRun:
    """Run the host checks against the hosts; every outcome is returned, JUnit XML written if asked."""
    if not hosts:
        raise ValidationError("verify: no hosts selected (check --limit)")
    with tempfile.TemporaryDirectory(prefix="pdfleet-verify-") as tmp:
        work = Path(tmp)
        (work / "cm").mkdir(mode=0o700)
        config = work / "ssh_config"
        config.write_text(
            ssh_config(hosts, options.default_known_hosts, work / "cm", options.connect_timeout)
        )
        plugin = VerifyPlugin(profile, topology, list(hosts), options, config, units_for)
        ini = work / "pytest.ini"
        ini.write_text(HOST_CHECKS_INI)
        args = [
            str(HOST_CHECKS_DIR),
            "-c",
            str(ini),
            "-qq",
            "--tb=no",
            "-p",
            "no:cacheprovider",
            "--no-header",
            "-rN",
            f"--rootdir={HOST_CHECKS_DIR}",
        ]
        if options.junit:
            args.append(f"--junitxml={options.junit}")
        if options.checks:
            args += ["-k", options.checks]
        try:
            code = pytest.main(args, plugins=[plugin])
        finally:
            _close_masters(config, hosts)
    return VerifyRun(plugin.results, int(code))


def table_rows(
    results: Sequence[CheckResult],
) -> tuple[list[str], list[str], dict[tuple[str, str], CheckResult]]:
    """(checks in run order, hosts in run order, (check, host) → result) for the summary table."""
    checks: list[str] = []
    hosts: list[str] = []
    cells: dict[tuple[str, str], CheckResult] = {}
    for r in results:
        if r.check not in checks:
            checks.append(r.check)
        if r.host not in hosts:
            hosts.append(r.host)
        cells[(r.check, r.host)] = r
    return checks, hosts, cells


def print_results(run: VerifyRun) -> None:
    """The host × check table, then each skip reason and failure, one line each."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    checks, hosts, cells = table_rows(run.results)
    table = Table(title="verify", show_lines=False)
    table.add_column("check")
    for h in hosts:
        table.add_column(h, justify="center")
    style = {PASS: "[green]pass[/]", FAIL: "[bold red]FAIL[/]", SKIP: "[yellow]skip[/]"}
    for check in checks:
        table.add_row(
            check, *(style[cells[(check, h)].outcome] if (check, h) in cells else "" for h in hosts)
        )
    console.print(table)
    for r in run.results:
        if r.outcome == SKIP:
            console.print(f"[yellow]skip[/] {r.host} {r.check}: {r.detail}", highlight=False)
    for r in run.results:
        if r.outcome == FAIL:
            console.print(f"[bold red]FAIL[/] {r.host} {r.check}: {r.detail}", highlight=False)
    totals = {k: sum(1 for r in run.results if r.outcome == k) for k in (PASS, FAIL, SKIP)}
    console.print(f"{totals[PASS]} passed, {totals[FAIL]} failed, {totals[SKIP]} skipped", highlight=False)


def remote_fact(target: Any, fact: Fact[T]) -> T:
    """A pdfleet fact gathered on a testinfra host (same command and parser as provision uses)."""
    result = target.run(fact.command())
    return fact.parse(result.stdout, result.rc)


def read_env(target: Any, path: str) -> dict[str, str] | None:
    """KEY=value pairs of a systemd EnvironmentFile on the host; None when it does not exist."""
    result = target.run(f"cat {shlex.quote(path)}")
    return dict(env_pairs(result.stdout)) if result.rc == 0 else None
