"""The fleet and metrics view end to end: gather over SSH, HTTP and the MetricsSource, then run the rules."""

from __future__ import annotations

from collections.abc import Callable

from pdfleet.doctor.finding import Finding
from pdfleet.doctor.fleet_facts import (
    Connector,
    FleetFacts,
    connect_hosts,
    gather_connects,
    gather_instances,
    gather_p2p,
    gather_rdma,
)
from pdfleet.doctor.fleet_rules import FLEET_RULES
from pdfleet.doctor.metrics_rules import METRICS_RULES, gather_figures, rule_metrics_read
from pdfleet.doctor.report import run_rules
from pdfleet.fleet.topology import Topology
from pdfleet.metrics.source import MetricsSource
from pdfleet.model.inventory import Inventory
from pdfleet.model.profile import Profile
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release

Metrics = Callable[[], tuple[MetricsSource, str, float]]  # -> (source, what it is, window in seconds)


def gather_fleet(
    profile: Profile,
    inventory: Inventory,
    topology: Topology,
    connect: Connector,
    metrics: Metrics | None,
    timeout: float,
) -> FleetFacts:
    """Every fact the fleet rules read; hosts are connected once and closed at the end."""
    names = sorted({i.host for i in topology.instances})
    hosts, failed = connect_hosts(names, inventory.hosts, connect)
    try:
        instances = gather_instances(topology, hosts, timeout)
        connects = gather_connects(profile, topology, hosts)
        p2p = gather_p2p(topology, hosts) if profile.topology == "same-host" else {}
        rdma = gather_rdma(profile, hosts, inventory.hosts, topology)
    finally:
        for transport in hosts.values():
            transport.close()
    figures, source_name = {}, ""
    release = find_release(profile.vllm.version, RELEASES)
    if metrics is not None and release is not None:
        source, source_name, window = metrics()
        roles = {r: len(topology.pool(r)) for r in ("prefill", "decode", "colocated") if topology.pool(r)}
        figures = gather_figures(source, release, roles, window)
    return FleetFacts(
        profile, topology, tuple(instances), tuple(connects), p2p, tuple(rdma), figures, source_name, failed
    )


def diagnose_fleet(facts: FleetFacts) -> list[Finding]:
    """Every fleet and metrics rule; one `ok` finding saying what was checked when nothing was found."""
    findings = run_rules(FLEET_RULES, facts)
    for rule in METRICS_RULES:
        findings += rule(facts.profile, facts.figures)
    findings += rule_metrics_read(facts.metrics_source, facts.figures)
    if not [f for f in findings if f.severity != "ok"]:
        checked = [
            f"{len(facts.instances)} instances (units, releases)",
            f"{len(facts.connects)} side-channel connects from decode hosts",
            f"metrics of {', '.join(sorted(facts.figures)) or 'no role'} from {facts.metrics_source or '-'}",
        ]
        findings.append(
            Finding(
                "fleet.ok",
                "ok",
                f"profile {facts.profile.name}: KV transfer and tuning rules found nothing",
                "\n".join(checked),
                "",
                subject=facts.profile.name,
            )
        )
    return findings
