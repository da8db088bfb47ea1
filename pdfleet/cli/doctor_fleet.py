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
    from pdfleet.doctor.finding import Finding
    from pdfleet.doctor.fleet import Metrics
    from pdfleet.fleet.topology import Topology
    from pdfleet.metrics.source import MetricsSource
    from pdfleet.model.inventory import Host
    from pdfleet.ops.ssh import Transport


def fleet_findings(
    ctx: Context, profile: str, inventory: str | None, window_s: float, sample_s: float, timeout: float
) -> tuple[list[Finding], str]:
    """Load the deployment (bad profile or inventory: a clear error), gather, diagnose."""
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
    return diagnose_fleet(facts), deployment.profile.name


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
