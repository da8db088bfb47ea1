"""Which vLLM instances (prefill, decode, colocated) a host runs, and their per-instance settings.

One place decides unit names, ports, side-channel ports and env-file paths, so the services role,
`render`, `verify` and the gateway's router all agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.model.inventory import Host
from pdfleet.model.profile import PoolSpec, Profile
from pdfleet.ops.base import Handler
from pdfleet.ops.systemd import restart_handler

ENV_DIR = "/etc/pdfleet"
UNIT_DIR = "/etc/systemd/system"
HEALTH_TIMEOUT_S = 1800  # a 70B model can take many minutes to load; vLLM answers /health only after


@dataclass(frozen=True)
class PoolInstance:
    """One vLLM server process on a host: a pool's unit with its port, GPUs and KV side channel."""

    pool: str
    spec: PoolSpec
    unit: str
    port: int
    gpus: tuple[int, ...]
    kv_role: str | None
    side_channel_host: str | None
    side_channel_port: int | None
    env_file: str
    unit_path: str
    health_url: str
    restart: Handler


def host_instances(profile: Profile, host: Host) -> list[PoolInstance]:
    """The vLLM instances this host runs: one per pool the profile sets whose inventory group (named
    like the pool) the host is in, in pool order."""
    pools = profile.pools.items()
    return [_instance(profile, host, pool, spec) for pool, spec in pools if host.in_group(pool)]


def _instance(profile: Profile, host: Host, pool: str, spec: PoolSpec) -> PoolInstance:
    unit = f"vllm-{pool}.service"
    kv = profile.kv_transfer
    sc_port = kv.side_channel_port_for(pool)  # None for the colocated pool and non-NIXL connectors
    sc_host = None
    if sc_port is not None:
        sc_host = host.address if kv.side_channel_host == "auto" else kv.side_channel_host
    health_url = f"http://{serve_address(host)}:{spec.port}/health"
    return PoolInstance(
        pool=pool,
        spec=spec,
        unit=unit,
        port=spec.port,
        gpus=tuple(spec.gpus),
        kv_role=spec.kv_role,
        side_channel_host=sc_host,
        side_channel_port=sc_port,
        env_file=f"{ENV_DIR}/vllm-{pool}.env",
        unit_path=f"{UNIT_DIR}/{unit}",
        health_url=health_url,
        restart=restart_handler(unit, health_url=health_url, timeout=HEALTH_TIMEOUT_S),
    )


def serve_address(host: Host) -> str:
    """The address a pool listens on: the host's inventory address, so routers on other hosts reach it."""
    return host.address


def pool_urls(profile: Profile, hosts: list[Host], pool: str) -> list[str]:
    """Base URLs (http://addr:port) of every instance of `pool` across the given hosts."""
    urls = []
    for host in hosts:
        for inst in host_instances(profile, host):
            if inst.pool == pool:
                urls.append(f"http://{serve_address(host)}:{inst.port}")
    return urls
