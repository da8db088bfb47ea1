"""`invoke doctor --profile P`: the deployment, SSH to its hosts, the metrics source as `invoke monitor` and
`invoke bench` choose it (the topology's Prometheus when it answers, else direct scrapes), named on stderr."""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from typing import TYPE_CHECKING

from invoke import Context

from pdfleet.cli.options import open_deployment
from pdfleet.cli.settings import Settings
from pdfleet.errors import ConnectError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.checks.verify import CheckResult
    from pdfleet.doctor.finding import Finding
    from pdfleet.doctor.fleet import Metrics
    from pdfleet.doctor.kv_path_rules import KvPathResult, Outcome
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.fleet.topology import Topology
    from pdfleet.metrics.source import MetricsSource
    from pdfleet.model.inventory import Host
    from pdfleet.ops.ssh import Transport


KV_PATH_CHECK = "kv_path/kv_path"  # verify's check (pdfleet/checks/hosts/kv_path.py::test_kv_path)


def fleet_findings(
    ctx: Context,
    profile: str,
    inventory: str | None,
    window_s: float,
    sample_s: float,
    timeout: float,
    kv_path: bool = False,
) -> tuple[list[Finding], str]:
    """Load the deployment (bad profile or inventory: a clear error), gather, diagnose; with `kv_path`, also
    verify's KV-path probe of every prefill->decode pair (the kv.path rule)."""
    from pdfleet.doctor.fleet import diagnose_fleet, gather_fleet
    from pdfleet.lab.network import lab_route_problem
    from pdfleet.ops.ssh import open_connection

    settings = Settings.of(ctx)
    deployment = open_deployment(ctx, profile, inventory, manifests=True)
    inv, topo = deployment.inventory, deployment.topology
    problem = lab_route_problem([h.address for h in inv.hosts.values()])
    if problem:
        raise ConnectError(problem)

    def connect(host: Host) -> Transport:
        return open_connection(host, settings.known_hosts, settings.connect_timeout, check_sudo=False)

    source: Metrics = functools.partial(fleet_metrics, topo, window_s, sample_s, timeout)
    facts = gather_fleet(deployment.profile, inv, topo, connect, source, timeout, deployment.manifests)
    print(f"metrics: {facts.metrics_source or 'not read'}", file=sys.stderr)  # which Prometheus, if any
    findings = diagnose_fleet(facts)
    if kv_path:
        from pdfleet.doctor.kv_path_rules import rule_kv_path

        findings += rule_kv_path(kv_path_results(settings, deployment))
    return findings, deployment.profile.name


def kv_path_results(settings: Settings, deployment: Deployment) -> list[KvPathResult]:
    """Run verify's KV-path check alone on every prefill->decode pair of the deployment: each outcome."""
    from pdfleet.checks.kv_path import PROBE_FILE
    from pdfleet.checks.verify import VerifyOptions, run_verify

    options = VerifyOptions(
        kv_path=True,
        kv_probe_source=(settings.templates_dir / PROBE_FILE).read_text(),
        checks="kv_path",
        connect_timeout=int(settings.connect_timeout),
        default_known_hosts=settings.known_hosts,
    )
    with contextlib.redirect_stdout(sys.stderr):  # pytest's progress: stdout is the table or the JSON
        run = run_verify(deployment.profile, deployment.topology, deployment.hosts, options)
    return kv_path_outcomes(run.results)


def kv_path_outcomes(results: list[CheckResult]) -> list[KvPathResult]:
    """verify's results as the kv.path rule reads them: the KV-path check's per pair, and any collection
    failure (which would otherwise leave the pairs unprobed without a word)."""
    from pdfleet.checks.kv_path import split_message
    from pdfleet.doctor.kv_path_rules import KvPathResult

    out: list[KvPathResult] = []
    for r in results:
        if r.check != KV_PATH_CHECK and not r.check.startswith("collect "):
            continue
        summary, fix = split_message(r.detail) if r.outcome == "fail" else (r.detail, "")
        outcome: Outcome = "fail" if r.outcome == "fail" else "skip" if r.outcome == "skip" else "pass"
        out.append(KvPathResult(r.host if r.check == KV_PATH_CHECK else r.check, outcome, summary, fix))
    return out


def fleet_metrics(
    topology: Topology, window_s: float, sample_s: float, timeout: float
) -> tuple[MetricsSource, str, float]:
    """(source, what it is, window): the topology's Prometheus when it answers (figures over window_s),
    else two direct scrapes of the vLLM endpoints sample_s apart."""
    from pdfleet.bench.fleet_targets import direct_targets
    from pdfleet.metrics.direct import DirectScrape
    from pdfleet.metrics.prometheus import PrometheusClient
    from pdfleet.metrics.source import MetricsError

    if topology.prometheus is not None:
        prom = PrometheusClient(topology.prometheus.url, timeout=timeout)
        if prom.ready():
            return prom, f"Prometheus at {prom.base_url}", window_s
    direct = DirectScrape(direct_targets(topology), timeout=timeout)
    # the window's start: direct figures compare two scrapes; an endpoint down leaves its figures unread
    with contextlib.suppress(MetricsError):
        direct.scrape()
    time.sleep(sample_s)
    return direct, f"direct scrape of {len(direct.targets)} vLLM endpoints over {sample_s:g} s", sample_s
