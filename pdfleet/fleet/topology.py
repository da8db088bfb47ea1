"""The fleet's topology, computed once per command from the profile and the inventory.

Every pool instance (which host, which address and port, GPUs, kv role, side-channel ports, unit and
env file), the gateway hosts, the pool URLs the gateway routes between, the P/D router, every
metrics endpoint and which hosts are lab hosts. Roles, verify, status, render and the tasks read this
one object; nobody recomputes where a service listens.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pdfleet.fleet.host_layout import CONFIG_DIR, UNIT_DIR
from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.profile import Profile

ROUTER_ADDRESS = "127.0.0.1"  # vllm-router listens on each gateway host's loopback, for its gateway only
# Which gateway pool (X-Pdfleet-Pool) an instance serves, by its profile pool.
GATEWAY_POOL = {"prefill": "disagg", "decode": "disagg", "colocated": "colocated"}


@dataclass(frozen=True)
class Instance:
    """One vLLM (or simulator) server process: a pool's unit on a host, and where it listens."""

    pool: str  # prefill, decode or colocated
    host: str
    address: str  # the host's inventory address: routers on other hosts reach it there
    port: int
    gpus: tuple[int, ...]
    kv_role: str | None
    side_channel_host: str | None  # VLLM_NIXL_SIDE_CHANNEL_HOST (NixlConnector only)
    side_channel_port: int | None
    bootstrap_port: int | None  # VLLM_MOONCAKE_BOOTSTRAP_PORT (MooncakeConnector prefill only)

    @property
    def unit(self) -> str:
        return f"vllm-{self.pool}.service"

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    @property
    def env_file(self) -> str:
        return f"{CONFIG_DIR}/vllm-{self.pool}.env"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


@dataclass(frozen=True)
class Gateway:
    """pdfleet-gateway on a gateway host, and the P/D router beside it (on that host's loopback)."""

    host: str
    address: str
    port: int
    admin_port: int | None
    router_port: int | None  # None: the profile does not disaggregate, no router runs
    router_metrics_port: int | None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def router_url(self) -> str | None:
        return None if self.router_port is None else f"http://{ROUTER_ADDRESS}:{self.router_port}"


@dataclass(frozen=True)
class MetricsEndpoint:
    """A Prometheus text endpoint of one service, with the labels that say what it is."""

    job: str  # vllm, vllm-router, pdfleet-gateway
    host: str
    address: str
    port: int
    labels: Mapping[str, str] = field(default_factory=dict)  # pool, role, host

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/metrics"


@dataclass(frozen=True)
class Topology:
    """Where everything of a deployment runs (see the module docstring)."""

    instances: tuple[Instance, ...]
    gateways: tuple[Gateway, ...]
    # Why gateway hosts get no gateway under this profile (None: they do).
    no_gateway_reason: str | None
    lab_hosts: frozenset[str]
    pdfleet_hosts: frozenset[str]  # hosts that run pdfleet code: they install the host wheel

    def on_host(self, host: str) -> list[Instance]:
        """The instances a host runs, in pool order (prefill, decode, colocated)."""
        return [i for i in self.instances if i.host == host]

    def pool(self, pool: str) -> list[Instance]:
        """Every instance of a pool, in inventory order."""
        return [i for i in self.instances if i.pool == pool]

    def pool_urls(self, pool: str) -> list[str]:
        """Base URLs of every instance of a pool."""
        return [i.url for i in self.pool(pool)]

    def gateway_on(self, host: str) -> Gateway | None:
        """The gateway a host runs, if any."""
        return next((g for g in self.gateways if g.host == host), None)

    @property
    def metrics_endpoints(self) -> tuple[MetricsEndpoint, ...]:
        """Every service's metrics endpoint: vLLM instances, then each gateway and its router."""
        out = [
            MetricsEndpoint(
                "vllm",
                i.host,
                i.address,
                i.port,
                MappingProxyType({"pool": GATEWAY_POOL[i.pool], "role": i.pool, "host": i.host}),
            )
            for i in self.instances
        ]
        for g in self.gateways:
            out.append(
                MetricsEndpoint(
                    "pdfleet-gateway",
                    g.host,
                    g.address,
                    g.port,
                    MappingProxyType({"role": "gateway", "host": g.host}),
                )
            )
            if g.router_metrics_port is not None:
                labels = MappingProxyType({"pool": "disagg", "role": "router", "host": g.host})
                port = g.router_metrics_port
                out.append(MetricsEndpoint("vllm-router", g.host, g.address, port, labels))
        return tuple(out)


def build_topology(
    profile: Profile, inventory: Inventory, lab_network: ipaddress.IPv4Network | None = None
) -> Topology:
    """The topology of a validated profile on a checked inventory (see check_against_inventory).

    `lab_network`: addresses inside it are lab hosts (the CLI passes the lab's network).
    """
    hosts = list(inventory.hosts.values())
    instances = tuple(
        _instance(profile, h, pool) for h in hosts for pool, _ in profile.pools.items() if h.in_group(pool)
    )
    reason = None
    if profile.pools.colocated is None:
        reason = "the profile has no colocated pool; the gateway routes between colocated and P/D pools"
    gateways = () if reason else tuple(_gateway(profile, h) for h in inventory.group("gateway"))
    runs_pdfleet = {g.host for g in gateways}
    if profile.vllm.engine == "sim":
        runs_pdfleet |= {i.host for i in instances}
    return Topology(instances, gateways, reason, _lab_hosts(hosts, lab_network), frozenset(runs_pdfleet))


def _instance(profile: Profile, host: Host, pool: str) -> Instance:
    spec = profile.pools.get(pool)
    kv = profile.kv_transfer
    sc_port = profile.side_channel_port_for(pool)  # None for the colocated pool and non-NIXL connectors
    sc_host = None
    if sc_port is not None:
        sc_host = host.address if kv.side_channel_host == "auto" else kv.side_channel_host
    boot = kv.bootstrap_port_for(pool) if profile.disaggregated else None
    return Instance(
        pool, host.name, host.address, spec.port, tuple(spec.gpus), spec.kv_role, sc_host, sc_port, boot
    )


def _gateway(profile: Profile, host: Host) -> Gateway:
    gw = profile.gateway
    pd = profile.pools.prefill is not None and profile.pools.decode is not None
    return Gateway(
        host.name,
        host.address,
        gw.port,
        gw.admin_port,
        gw.router_port if pd else None,
        gw.router_prometheus_port if pd else None,
    )


def _lab_hosts(hosts: list[Host], network: ipaddress.IPv4Network | None) -> frozenset[str]:
    """Hosts whose address lies in the lab network (host names, not addresses, are never lab hosts)."""
    if network is None:
        return frozenset()
    found = set()
    for host in hosts:
        try:
            if ipaddress.ip_address(host.address) in network:
                found.add(host.name)
        except ValueError:
            continue
    return frozenset(found)
