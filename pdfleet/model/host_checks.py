"""What one host runs, checked for clashes: every TCP port it listens on and every GPU it hands out must
belong to one thing only, across every model the profile serves (issue 24), its pools, the gateway, each
P/D model's router beside it, and Prometheus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdfleet.model.inventory import Host
from pdfleet.model.problems import Problem
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release


@dataclass(frozen=True)
class HostRuns:
    """What one host runs: (model, pool) instances, and whether it is a gateway or monitoring host."""

    instances: Sequence[tuple[ServedModel, str]] = ()
    gateway: bool = False
    monitoring: bool = False


def instance_ports(profile: Profile, spec: ServedModel, pool: str) -> list[tuple[int, str]]:
    """Every TCP port one instance listens on (vLLM's, NIXL side channels per TP rank, Mooncake's
    bootstrap server, the KV-events publisher), each with the key path that sets it and what it is."""
    pool_spec = spec.pools.get(pool)
    ports = [(pool_spec.port, spec.key(f"pools.{pool}.port"))]
    side = spec.side_channel_port_for(pool, profile.vllm.version)
    if side is not None:
        base = spec.kv_transfer.side_channel_port
        label = spec.key("kv_transfer.side_channel_port") + (f"+{side - base}" if side != base else "")
        rel = find_release(profile.vllm.version, RELEASES)
        bound = rel.side_channel_ports(side, pool_spec.tensor_parallel_size) if rel else (side,)
        for rank, port in enumerate(bound):
            what = f"{pool} side channel" + (f", TP rank {rank}" if rank else "")
            ports.append((port, f"{label} ({what})"))
    boot = spec.bootstrap_port_for(pool)
    if boot is not None:
        ports.append((boot, spec.key("kv_transfer.mooncake_bootstrap_port")))
    events = spec.kv_events_port_for(pool)
    if events is not None:
        # a fixed port (not a key): the clash is mended by moving the other port
        base = events - (spec.index or 0)
        what = f"kv_events: {spec.key(f'pools.{pool}')}'s publisher, {base} + the model's place"
        ports.append((events, f"{spec.key('gateway.decider.cache_source')} ({what})"))
    replay = spec.kv_events_replay_port_for(pool)
    if replay is not None:
        base = replay - (spec.index or 0)
        what = f"kv_events: {spec.key(f'pools.{pool}')}'s replay socket, {base} + the model's place"
        ports.append((replay, f"{spec.key('gateway.decider.cache_source')} ({what})"))
    return ports


def gateway_ports(profile: Profile) -> list[tuple[int, str]]:
    """The ports a gateway host listens on: the gateway's, its admin port, and each P/D model's router
    and router metrics ports."""
    gw = profile.gateway
    ports = [(gw.port, "gateway.port")]
    if gw.admin_port is not None:
        ports.append((gw.admin_port, "gateway.admin_port"))
    for spec in profile.served:
        if spec.has_router:
            ports.append((spec.gateway.router_port, spec.key("gateway.router_port")))
            ports.append((spec.gateway.router_prometheus_port, spec.key("gateway.router_prometheus_port")))
    return ports


def host_ports(profile: Profile, runs: HostRuns) -> list[tuple[int, str]]:
    """Every TCP port a host with these instances (and maybe the gateway, Prometheus and Alertmanager)
    listens on; every host runs the node exporter."""
    ports = [port for spec, pool in runs.instances for port in instance_ports(profile, spec, pool)]
    if runs.gateway:
        ports += gateway_ports(profile)
    mon = profile.monitoring
    ports.append((mon.node_exporter_port, "monitoring.node_exporter_port"))
    if runs.monitoring:
        ports.append((mon.port, "monitoring.port"))
        ports.append((mon.alertmanager.port, "monitoring.alertmanager.port"))
        if mon.alertmanager.lab_receiver:
            ports.append((mon.alertmanager.lab_receiver_port, "monitoring.alertmanager.lab_receiver_port"))
    return ports


def host_problems(profile: Profile, runs: HostRuns, where: Host | None) -> list[Problem]:
    """Ports and GPUs must be distinct among everything one host runs."""
    on_host = f" on host {where.name}" if where else " on a same-host host" if len(runs.instances) > 1 else ""
    problems: list[Problem] = []
    seen: dict[int, str] = {}
    for port, label in host_ports(profile, runs):
        if port in seen:
            key = label.split(" ", 1)[0]
            problems.append(Problem(key, f"port {port} is used twice{on_host}: by {seen[port]} and {label}"))
        else:
            seen[port] = label
    owners: dict[int, str] = {}
    for spec, pool in runs.instances:
        where_key = spec.key(f"pools.{pool}")
        for gpu in spec.pools.get(pool).gpus:
            if gpu in owners and owners[gpu] != where_key:
                problems.append(
                    Problem(
                        f"{where_key}.gpus",
                        f"GPU {gpu} is given to both {owners[gpu]} and {where_key}{on_host}; "
                        "pools on one host need different GPUs",
                    )
                )
            owners.setdefault(gpu, where_key)
    return problems
