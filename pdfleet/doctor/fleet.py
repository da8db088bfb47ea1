"""The fleet and metrics view end to end: gather over SSH, HTTP and the MetricsSource, then run the rules."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pdfleet.doctor.finding import Finding
from pdfleet.doctor.fleet_facts import (
    FleetFacts,
    HostConnect,
    RoleFigures,
    connect_hosts,
    facts_to_gather,
    read_connects,
    read_instances,
    read_p2p,
    read_platforms,
    read_rdma,
)
from pdfleet.doctor.fleet_rules import FLEET_RULES
from pdfleet.doctor.metrics_rules import METRICS_RULES, gather_figures, rule_metrics_read
from pdfleet.doctor.report import run_rules
from pdfleet.errors import PdfleetError
from pdfleet.fleet.topology import Topology
from pdfleet.metrics.source import MetricsSource
from pdfleet.model.inventory import Inventory
from pdfleet.model.profile import Profile
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.errors import FactError
from pdfleet.ops.gather import HostFacts

HOST_BATCH_TIMEOUT_S = 60.0  # one host's batch: unit files, side-channel connects (3 s each), nvidia-smi
Metrics = Callable[[], tuple[MetricsSource, str, float]]  # -> (source, what it is, window in seconds)


def gather_fleet(
    profile: Profile,
    inventory: Inventory,
    topology: Topology,
    connect: HostConnect,
    metrics: Metrics | None,
    timeout: float,
    manifests: Mapping[str, WeightsManifest] | None = None,
) -> FleetFacts:
    """Every fact the fleet rules read; hosts are connected once and closed at the end. `manifests`: the
    staged models' (by model id), which the weights rule compares each host's files with."""
    names = sorted({i.host for i in topology.instances})
    transports, failed = connect_hosts(names, inventory.hosts, connect)
    try:
        hosts = {
            name: HostFacts(t, timeout=max(HOST_BATCH_TIMEOUT_S, timeout)) for name, t in transports.items()
        }
        for name, facts in facts_to_gather(profile, topology).items():
            if name not in hosts:
                continue
            try:
                hosts[name].gather(facts)  # one round trip per host
            except (FactError, PdfleetError) as exc:
                failed[name] = str(exc)
                del hosts[name]
        instances = read_instances(topology, hosts, timeout, profile)
        connects = read_connects(profile, topology, hosts)
        p2p = read_p2p(profile, topology, hosts)
        rdma = read_rdma(profile, hosts, inventory.hosts, topology)
        platforms = read_platforms(topology, hosts)
    finally:
        for transport in transports.values():
            transport.close()
    figures: dict[str, dict[str, RoleFigures]] = {}
    source_name = ""
    release = find_release(profile.vllm.version, RELEASES)
    if metrics is not None and release is not None:
        source, source_name, window = metrics()
        for spec in profile.served:  # a models: profile's by its instances' `model` label
            label = spec.name if spec.listed else None
            pools = {r: len(topology.pool(r, label)) for r in ("prefill", "decode", "colocated")}
            roles = {r: n for r, n in pools.items() if n}
            figures[spec.name] = gather_figures(source, release, roles, window, label)
    return FleetFacts(
        profile,
        topology,
        tuple(instances),
        tuple(connects),
        p2p,
        tuple(rdma),
        figures,
        source_name,
        failed,
        tuple(platforms),
        dict(manifests or {}),
    )


def read_figures(
    profile: Profile, figures: Mapping[str, Mapping[str, RoleFigures]]
) -> dict[str, RoleFigures]:
    """Every model's figures by `role` (a single-model profile) or `model/role`, for what is reported."""
    return {
        (f"{spec.name}/{role}" if spec.listed else role): fig
        for spec in profile.served
        for role, fig in figures.get(spec.name, {}).items()
    }


def diagnose_fleet(facts: FleetFacts) -> list[Finding]:
    """Every fleet and metrics rule; one `ok` finding saying what was checked when nothing was found."""
    findings = run_rules(FLEET_RULES, facts)
    profile = facts.profile
    for spec in profile.served:  # each model against its own pools (its key paths: models[i]...)
        view = profile.for_model(spec) if spec.listed else profile
        for rule in METRICS_RULES:
            findings += rule(view, facts.figures.get(spec.name, {}))
    read = read_figures(profile, facts.figures)
    findings += rule_metrics_read(facts.metrics_source, read)
    if not [f for f in findings if f.severity != "ok"]:
        checked = [
            f"{len(facts.instances)} instances (units, releases)",
            f"{len(facts.connects)} side-channel connects from decode hosts",
            f"metrics of {', '.join(sorted(read)) or 'no role'} from {facts.metrics_source or '-'}",
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
