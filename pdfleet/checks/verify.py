"""`invoke verify`: testinfra checks of every host over SSH, as a host × check table and JUnit XML.

The checks live in pdfleet.checks.hosts (one module per concern) and are run programmatically with pytest.
A VerifyPlugin hands them the validated profile and the fleet's topology, parametrises them over the selected
hosts, reaches each host over the connection pdfleet.ops.ssh opens (strict host-key checking against the
inventory's known_hosts, as provision) with testinfra on top (pdfleet.checks.target), gathers each host's
unit-health facts in one command, and records every outcome. A host that does not answer, or whose key is
unknown or changed, fails its checks with the reason. A check that does not apply to a host skips with the
reason; the run fails on any failed check.
"""

from __future__ import annotations

import re
import shlex
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from pdfleet.errors import PdfleetError, ValidationError
from pdfleet.fleet.roles import ManagedUnit, host_kv_profile, instance_unit
from pdfleet.fleet.topology import Topology
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.base import Fact
from pdfleet.ops.errors import FactError
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import SshTransport, open_connection
from pdfleet.ops.unit_health import PROBE_TIMEOUT_S, UnitHealth, UnitState

HOST_CHECKS_DIR = Path(__file__).resolve().parent / "hosts"
# The checks are product modules named for their concern (gpu.py, not test_gpu.py); this ini makes pytest
# collect them, and keeps the clone's own pytest settings (addopts, testpaths) out of the run.
HOST_CHECKS_INI = "[pytest]\npython_files = *.py\n"
PASS, FAIL, SKIP, WARN = "pass", "fail", "skip", "warn"  # warn: passed, with something to act on soon
T = TypeVar("T")


@dataclass(frozen=True)
class VerifyOptions:
    """What the operator asked for on the command line."""

    junit: Path | None = None
    rdma_bandwidth: bool = False
    kv_path: bool = False  # run the KV-path probe on every prefill->decode pair (checks/hosts/kv_path.py)
    kv_probe_source: str = ""  # its program's source (templates/kv_probe.py), sent to the hosts
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


def host_units(topology: Topology, host: Host) -> list[ManagedUnit]:
    """The vLLM pool units a host runs (used when no role list is at hand)."""
    return [instance_unit(i) for i in topology.on_host(host.name)]


def kv_pairs(topology: Topology, hosts: Sequence[Host]) -> list[tuple[Host, Host]]:
    """(prefill, decode) host pairs whose instances serve one model, same-host pairs included, among the
    selected hosts, in topology order: the pairs whose KV path `--kv-path` probes."""
    by_name = {h.name: h for h in hosts}
    pairs: list[tuple[Host, Host]] = []
    for p in topology.pool("prefill"):
        for d in topology.pool("decode", p.model):
            pair = (by_name.get(p.host), by_name.get(d.host))
            if pair[0] and pair[1] and pair not in pairs:
                pairs.append((pair[0], pair[1]))
    return pairs


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


@dataclass(eq=False)  # pluggy keeps plugins in sets: hash by identity
class VerifyPlugin:
    """pytest plugin giving the host checks the profile, the topology, and per host one SSH connection
    (ops.ssh), a testinfra host over it and its facts."""

    profile: Profile
    topology: Topology
    hosts: list[Host]
    options: VerifyOptions
    units_for: Callable[[Host], list[ManagedUnit]] | None = None
    manifests: Mapping[str, WeightsManifest] = field(default_factory=dict)  # staged models' by model id
    results: list[CheckResult] = field(default_factory=list)
    _connections: dict[str, SshTransport | str] = field(default_factory=dict)  # host -> it, or why not
    _targets: dict[str, Any] = field(default_factory=dict)
    _facts: dict[str, HostFacts] = field(default_factory=dict)

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "pd_host" in metafunc.fixturenames:
            metafunc.parametrize("pd_host", self.hosts, ids=[h.name for h in self.hosts])
        if "pd_pair" in metafunc.fixturenames:
            pairs = pd_pairs(self.hosts)
            metafunc.parametrize("pd_pair", pairs, ids=[f"{p.name}->{d.name}" for p, d in pairs])
        if "kv_pair" in metafunc.fixturenames:
            pairs = kv_pairs(self.topology, self.hosts)
            metafunc.parametrize("kv_pair", pairs, ids=[f"{p.name}->{d.name}" for p, d in pairs])

    def kv_profile(self, host: Host) -> Profile:
        """The profile as the host's P/D model has it (fleet.roles.host_kv_profile: what the roles
        installed there by): its connector, topology and pools."""
        return host_kv_profile(self.profile, self.topology.on_host(host.name))

    def connection(self, host: Host) -> SshTransport:
        """The host's SSH connection, opened once; a host that cannot be reached fails the check asking,
        with ops.ssh's reason (refused, timed out, unknown or changed host key, no passwordless sudo)."""
        if host.name not in self._connections:
            try:
                self._connections[host.name] = open_connection(
                    host, self.options.default_known_hosts, self.options.connect_timeout
                )
            except PdfleetError as exc:
                self._connections[host.name] = str(exc)
        found = self._connections[host.name]
        if isinstance(found, str):
            pytest.fail(f"cannot reach {host.name} ({host.address}:{host.port}) over SSH: {found}", False)
        return found

    def target_for(self, host: Host) -> Any:
        """The testinfra host for an inventory host, over its connection, cached."""
        if host.name not in self._targets:
            from pdfleet.checks.target import testinfra_host

            self._targets[host.name] = testinfra_host(self.connection(host))
        return self._targets[host.name]

    def facts(self, host: Host) -> HostFacts:
        """The host's facts over its connection, cached for the run (what provision reads, read alike)."""
        if host.name not in self._facts:
            timeout = self.options.connect_timeout + 2 * PROBE_TIMEOUT_S
            self._facts[host.name] = HostFacts(self.connection(host), timeout=timeout)
        return self._facts[host.name]

    def unit_states(self, host: Host) -> list[tuple[ManagedUnit, UnitState | str]]:
        """Each unit the host should run with its unit-health fact (state and /health), all in one remote
        command; a unit whose state could not be read comes with why."""
        units = self.units(host)
        facts = self.facts(host)
        wanted = [UnitHealth(u.unit, u.health_url) for u in units]
        facts.gather(wanted)
        out: list[tuple[ManagedUnit, UnitState | str]] = []
        for unit, fact in zip(units, wanted, strict=True):
            try:
                out.append((unit, facts.get(fact)))
            except (FactError, PdfleetError) as exc:
                out.append((unit, str(exc)))
        return out

    def close(self) -> None:
        """Close every connection the run opened."""
        for found in self._connections.values():
            if not isinstance(found, str):
                found.close()

    @pytest.fixture
    def verify(self) -> VerifyPlugin:
        return self

    def units(self, host: Host) -> list[ManagedUnit]:
        """The units the host should run: from the roles when given, else its vLLM pools."""
        return self.units_for(host) if self.units_for else host_units(self.topology, host)

    @pytest.fixture
    def target(self, pd_host: Host) -> Any:
        return self.target_for(pd_host)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and not report.passed):
            host, check = _host_and_check(report.nodeid)
            outcome = PASS if report.passed else SKIP if report.skipped else FAIL
            detail = _detail(report) if not report.passed else ""
            if report.passed:  # a check says more through record_property("warn" | "note", text)
                said = dict(report.user_properties)
                outcome = WARN if WARN in said else PASS
                detail = str(said.get(WARN) or said.get("note") or "")
            self.results.append(CheckResult(host, check, outcome, detail))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.results.append(CheckResult("-", f"collect {report.nodeid}", FAIL, _detail(report)))

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Leave out the bandwidth check unless --rdma-bandwidth was given, the KV-path probe unless
        --kv-path was."""
        asked = {"pd_pair": self.options.rdma_bandwidth, "kv_pair": self.options.kv_path}
        fixtures = [name for name, on in asked.items() if not on]
        dropped = [i for i in items if any(f in getattr(i, "fixturenames", ()) for f in fixtures)]
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


def run_verify(
    profile: Profile,
    topology: Topology,
    hosts: Sequence[Host],
    options: VerifyOptions,
    units_for: Callable[[Host], list[ManagedUnit]] | None = None,
    manifests: Mapping[str, WeightsManifest] | None = None,
) -> VerifyRun:
    """Run the host checks against the hosts; every outcome is returned, JUnit XML written if asked."""
    if not hosts:
        raise ValidationError("verify: no hosts selected (check --limit)")
    plugin = VerifyPlugin(profile, topology, list(hosts), options, units_for, dict(manifests or {}))
    with tempfile.TemporaryDirectory(prefix="pdfleet-verify-") as tmp:
        ini = Path(tmp) / "pytest.ini"
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
            plugin.close()
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
    style = {
        PASS: "[green]pass[/]",
        FAIL: "[bold red]FAIL[/]",
        SKIP: "[yellow]skip[/]",
        WARN: "[magenta]warn[/]",
    }
    for check in checks:
        table.add_row(
            check, *(style[cells[(check, h)].outcome] if (check, h) in cells else "" for h in hosts)
        )
    console.print(table)
    for shown in (PASS, SKIP, WARN, FAIL):  # a pass's note (e.g. a certificate's expiry), skips, warnings
        for r in run.results:
            if r.outcome == shown and r.detail:
                console.print(f"{style[shown]} {r.host} {r.check}: {r.detail}", highlight=False)
    totals = {k: sum(1 for r in run.results if r.outcome == k) for k in (PASS, FAIL, SKIP, WARN)}
    warned = f", {totals[WARN]} warned" if totals[WARN] else ""
    console.print(
        f"{totals[PASS]} passed, {totals[FAIL]} failed, {totals[SKIP]} skipped{warned}", highlight=False
    )


def remote_fact(target: Any, fact: Fact[T]) -> T:
    """A pdfleet fact gathered on a testinfra host (same command and parser as provision uses)."""
    result = target.run(fact.command())
    return fact.parse(result.stdout, result.rc)


def read_env(target: Any, path: str) -> dict[str, str] | None:
    """KEY=value pairs of a systemd EnvironmentFile on the host; None when it does not exist."""
    result = target.run(f"cat {shlex.quote(path)}")
    return dict(env_pairs(result.stdout)) if result.rc == 0 else None
