"""The fleet's topology, computed once per command from the profile and the inventory: the one address book.

Every pool instance (which host, which address and port, GPUs, kv role, side-channel ports, unit and
env file), the gateway hosts with their admin URLs, the pool URLs the gateway routes between, the P/D
router, every metrics endpoint, Prometheus on the monitoring hosts, the rollout controller and its paths,
which hosts are lab hosts and which install the host wheel. Roles, verify, status, render, bench, doctor,
monitor and rollout read this one object; nobody recomputes where a service listens
(tests/unit/test_layout.py fails on code that does).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pdfleet.fleet.host_layout import CONFIG_DIR, UNIT_DIR
from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.profile import Profile
from pdfleet.rollout.config import DEFAULT_CONFIG, STATE_DIR

ROUTER_ADDRESS = "127.0.0.1"  # vllm-router listens on each gateway host's loopback, for its gateway only
# Which gateway pool (X-Pdfleet-Pool) an instance serves, by its profile pool.
GATEWAY_POOL = {"prefill": "disagg", "decode": "disagg", "colocated": "colocated"}
MONITORING_GROUP = "monitoring"  # the inventory group whose hosts run Prometheus (the first: the controller)


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

    @property
    def admin_url(self) -> str:
        """Base URL of the admin endpoints (/admin/...): their own port when the profile sets one."""
        return f"http://{self.address}:{self.admin_port or self.port}"


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
class Prometheus:
    """Prometheus on a monitoring host: the host's inventory address and the profile's monitoring.port."""

    host: str
    address: str
    port: int

    @property
    def listen_address(self) -> str:
        """--web.listen-address: HOST:PORT."""
        return f"{self.address}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL its HTTP API answers on (what bench, doctor, monitor and the controller query)."""
        return f"http://{self.listen_address}"

    @property
    def ready_url(self) -> str:
        return f"{self.url}/-/ready"

    @property
    def metrics_endpoint(self) -> MetricsEndpoint:
        """Its own /metrics, which it scrapes as job `prometheus`."""
        labels = MappingProxyType({"role": "prometheus", "host": self.host})
        return MetricsEndpoint("prometheus", self.host, self.address, self.port, labels)


@dataclass(frozen=True)
class Controller:
    """The rollout controller (pdfleet-rollout) on the first monitoring host: where it is installed, reads
    its configuration and the gateways' admin key, and keeps its state."""

    host: Host
    venv: str = "/opt/pdfleet/rollout"
    config_file: str = str(DEFAULT_CONFIG)  # the controller's own default (pdfleet.rollout.config)
    key_file: str = str(DEFAULT_CONFIG.parent / "admin.key")
    state_dir: str = str(STATE_DIR)
    unit: str = "pdfleet-rollout.service"

    @property
    def config_dir(self) -> str:
        return self.config_file.rsplit("/", 1)[0]

    @property
    def bin(self) -> str:
        return f"{self.venv}/bin/pdfleet-rollout"


def monitoring_hosts(inventory: Inventory) -> list[Host]:
    """The inventory's monitoring hosts, in file order (each runs Prometheus)."""
    return inventory.group(MONITORING_GROUP)


def controller_of(inventory: Inventory) -> Controller | None:
    """Where the rollout controller runs: the first monitoring host (None: the inventory has none).
    Needs no profile: `invoke rollout.status` without --profile reaches it too."""
    hosts = monitoring_hosts(inventory)
    return Controller(hosts[0]) if hosts else None


@dataclass(frozen=True)
class Topology:
    """Where everything of a deployment runs (see the module docstring)."""

    instances: tuple[Instance, ...]
    gateways: tuple[Gateway, ...]
    # Why gateway hosts get no gateway under this profile (None: they do).
    no_gateway_reason: str | None
    lab_hosts: frozenset[str]
    pdfleet_hosts: frozenset[str]  # hosts that run pdfleet code: they install the host wheel
    monitoring: tuple[Prometheus, ...] = ()  # one per monitoring host, in inventory order
    # the rollout controller, when it is installed (a monitoring host, gateways and a rollout plan)
    controller: Controller | None = None
    no_controller_reason: str | None = "the inventory has no host in the `monitoring` group"

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
    def prometheus(self) -> Prometheus | None:
        """The Prometheus the tasks read: the first monitoring host's (None: the inventory has none)."""
        return self.monitoring[0] if self.monitoring else None

    def prometheus_on(self, host: str) -> Prometheus | None:
        """The Prometheus a host runs, if any."""
        return next((p for p in self.monitoring if p.host == host), None)

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
    monitoring = tuple(
        Prometheus(h.name, h.address, profile.monitoring.port) for h in monitoring_hosts(inventory)
    )
    controller, why_no_controller = _controller(profile, inventory, gateways)
    runs_pdfleet = {g.host for g in gateways}
    if profile.vllm.engine == "sim":
        runs_pdfleet |= {i.host for i in instances}
    if controller is not None:
        runs_pdfleet.add(controller.host.name)
    return Topology(
        instances,
        gateways,
        reason,
        _lab_hosts(hosts, lab_network),
        frozenset(runs_pdfleet),
        monitoring,
        controller,
        why_no_controller,
    )


def _controller(
    profile: Profile, inventory: Inventory, gateways: tuple[Gateway, ...]
) -> tuple[Controller | None, str | None]:
    """The rollout controller and None, or None and why it is not installed."""
    controller = controller_of(inventory)
    if controller is None:
        return None, f"the inventory has no host in the `{MONITORING_GROUP}` group"
    if not gateways:
        return None, "the topology has no gateway: there is no stage to roll out"
    if not profile.rollout.plans:
        return None, "the profile has no rollout.plans"
    return controller, None


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
