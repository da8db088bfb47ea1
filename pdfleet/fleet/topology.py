"""The fleet's topology, computed once per command from the profile and the inventory: the one address book.

Every pool instance of every model the profile serves (which model, host, address and port, GPUs, kv
role, side-channel ports, unit and env file), each model's pool URLs and its P/D router on every gateway
host (`Topology.models`), the gateway hosts with their admin URLs, every metrics endpoint (vLLM and
router targets carry the model's name as the `model` label), Prometheus on the monitoring hosts, the
rollout controller and its paths, which hosts are lab hosts and which install the host wheel. Roles,
verify, status, render, bench, doctor, monitor and rollout read this one object; nobody recomputes where
a service listens (tests/unit/test_layout.py fails on code that does).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from pdfleet.fleet.controller import Controller, placement
from pdfleet.fleet.host_layout import CONFIG_DIR, UNIT_DIR
from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel, pool_hosts

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
    model: str = ""  # the name of the model it serves (ServedModel.name)
    listed: bool = False  # the profile lists models: its unit and env file names carry the model's name
    kv_events_port: int | None = None  # its KV-events publisher (gateway.decider.cache_source: kv_events)
    kv_events_replay_port: int | None = None  # the publisher's replay socket (vLLM's replay_endpoint)

    @property
    def stem(self) -> str:
        """vllm-{pool} for a single-model profile (names as ever), vllm-{model}-{pool} in a models: list."""
        return f"vllm-{self.model}-{self.pool}" if self.listed else f"vllm-{self.pool}"

    @property
    def unit(self) -> str:
        return f"{self.stem}.service"

    @property
    def unit_path(self) -> str:
        return f"{UNIT_DIR}/{self.unit}"

    @property
    def env_file(self) -> str:
        return f"{CONFIG_DIR}/{self.stem}.env"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    @property
    def kv_events_endpoint(self) -> str | None:
        """Where the gateway subscribes to its KV events (None: it publishes none)."""
        return None if self.kv_events_port is None else f"tcp://{self.address}:{self.kv_events_port}"

    @property
    def kv_events_replay_endpoint(self) -> str | None:
        """Where the gateway asks for the KV-event batches it missed (None: no replay socket)."""
        port = self.kv_events_replay_port
        return None if port is None else f"tcp://{self.address}:{port}"


@dataclass(frozen=True)
class Router:
    """A disaggregated model's vllm-router on a gateway host: its API on that host's loopback (for its
    gateway only), its metrics on the host's address (for Prometheus)."""

    model: str
    host: str
    address: str
    port: int
    metrics_port: int
    unit: str  # vllm-router-pd.service for a single-model profile, else vllm-router-{model}-pd.service

    @property
    def url(self) -> str:
        return f"http://{ROUTER_ADDRESS}:{self.port}"

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"


@dataclass(frozen=True)
class ModelTopology:
    """Where one model runs: its instances, and its P/D router on each gateway host (none: colocated only,
    or no gateway)."""

    name: str
    aliases: tuple[str, ...]
    instances: tuple[Instance, ...]
    routers: tuple[Router, ...]
    disaggregated: bool  # it runs prefill and decode pools

    def pool(self, pool: str) -> list[Instance]:
        """Every instance of one of its pools, in inventory order."""
        return [i for i in self.instances if i.pool == pool]

    def pool_urls(self, pool: str) -> list[str]:
        """Base URLs of every instance of one of its pools."""
        return [i.url for i in self.pool(pool)]

    def router_on(self, host: str) -> Router | None:
        """Its router on a gateway host, if it has one there."""
        return next((r for r in self.routers if r.host == host), None)


@dataclass(frozen=True)
class Gateway:
    """pdfleet-gateway on a gateway host, and the P/D router beside it (on that host's loopback)."""

    host: str
    address: str
    port: int
    admin_port: int | None
    # the first disaggregated model's router (None: no model disaggregates); Topology.models has each one's
    router_port: int | None
    router_metrics_port: int | None
    ca_file: str | None = None  # its CA on the control machine, clients verify with (None: tls: off)

    @property
    def scheme(self) -> str:
        return "http" if self.ca_file is None else "https"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}:{self.port}"

    @property
    def router_url(self) -> str | None:
        return None if self.router_port is None else f"http://{ROUTER_ADDRESS}:{self.router_port}"

    @property
    def admin_url(self) -> str:
        """Base URL of the admin endpoints (/admin/...): their own port when the profile sets one."""
        return f"{self.scheme}://{self.address}:{self.admin_port or self.port}"


@dataclass(frozen=True)
class MetricsEndpoint:
    """A Prometheus text endpoint of one service, with the labels that say what it is."""

    job: str  # vllm, vllm-router, pdfleet-gateway
    host: str
    address: str
    port: int
    labels: Mapping[str, str] = field(default_factory=dict)  # pool, role, host
    scheme: str = "http"  # https: the gateway's TLS listener (Prometheus verifies it against the CA)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}:{self.port}/metrics"


@dataclass(frozen=True)
class Alertmanager:
    """Alertmanager beside Prometheus on a monitoring host (its address, monitoring.alertmanager.port), and
    the lab's notification recorder there when the profile asks for it (recorder_port)."""

    host: str
    address: str
    port: int
    recorder_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    @property
    def recorder_url(self) -> str | None:
        return None if self.recorder_port is None else f"http://{self.address}:{self.recorder_port}"


@dataclass(frozen=True)
class Prometheus:
    """Prometheus on a monitoring host: the host's inventory address and the profile's monitoring.port."""

    host: str
    address: str
    port: int
    alertmanager: Alertmanager | None = None  # beside it on the same host (None: a test's bare server)

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
    models: tuple[ModelTopology, ...] = ()  # per served model, in the profile's order
    node_exporters: tuple[MetricsEndpoint, ...] = ()  # one per inventory host, in inventory order

    def on_host(self, host: str) -> list[Instance]:
        """The instances a host runs, model by model, each in pool order (prefill, decode, colocated)."""
        return [i for i in self.instances if i.host == host]

    def model(self, name: str | None = None) -> ModelTopology:
        """A model's topology by name; without one, the first model's (a single-model profile's only one)."""
        if name is None:
            return self.models[0]
        found = next((m for m in self.models if m.name == name), None)
        if found is None:
            raise KeyError(f"no model {name!r}; models: {', '.join(m.name for m in self.models)}")
        return found

    def pool(self, pool: str, model: str | None = None) -> list[Instance]:
        """Every instance of a pool, in inventory order: of one model, or (None) of every model."""
        return [i for i in self.instances if i.pool == pool and (model is None or i.model == model)]

    def pool_urls(self, pool: str, model: str | None = None) -> list[str]:
        """Base URLs of every instance of a pool (of one model, or of every model)."""
        return [i.url for i in self.pool(pool, model)]

    def routers_on(self, host: str) -> list[Router]:
        """Every P/D router a gateway host runs, one per disaggregated model, in the profile's order."""
        return [r for m in self.models if (r := m.router_on(host)) is not None]

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
        """Every service's metrics endpoint: vLLM instances, each gateway and its router, every host's node
        exporter."""
        out = [
            MetricsEndpoint(
                "vllm",
                i.host,
                i.address,
                i.port,
                MappingProxyType(
                    {"pool": GATEWAY_POOL[i.pool], "role": i.pool, "host": i.host, "model": i.model}
                ),
            )
            for i in self.instances
        ]
        for g in self.gateways:
            gw_labels = MappingProxyType({"role": "gateway", "host": g.host})
            out.append(MetricsEndpoint("pdfleet-gateway", g.host, g.address, g.port, gw_labels, g.scheme))
            for r in self.routers_on(g.host):
                labels = MappingProxyType(
                    {"pool": "disagg", "role": "router", "host": g.host, "model": r.model}
                )
                out.append(MetricsEndpoint("vllm-router", g.host, g.address, r.metrics_port, labels))
        return (*out, *self.node_exporters)


def build_topology(
    profile: Profile, inventory: Inventory, lab_network: ipaddress.IPv4Network | None = None
) -> Topology:
    """The topology of a validated profile on a checked inventory (see check_against_inventory).

    `lab_network`: addresses inside it are lab hosts (the CLI passes the lab's network).
    """
    hosts = list(inventory.hosts.values())
    served = profile.served
    instances = tuple(i for spec in served for i in _instances(profile, inventory, spec))
    without = [spec.name for spec in served if spec.pools.colocated is None]
    reason = None
    if without:
        which = f"model {without[0]}" if profile.models else "the profile"
        reason = f"{which} has no colocated pool; the gateway routes between colocated and P/D pools"
    gateway_hosts = () if reason else tuple(inventory.group("gateway"))
    models = tuple(_model(spec, instances, gateway_hosts) for spec in served)
    gateways = tuple(_gateway(profile, h, models) for h in gateway_hosts)
    am = profile.monitoring.alertmanager
    recorder = am.lab_receiver_port if am.lab_receiver else None
    monitoring = tuple(
        Prometheus(
            h.name, h.address, profile.monitoring.port, Alertmanager(h.name, h.address, am.port, recorder)
        )
        for h in monitoring_hosts(inventory)
    )
    controller, why_no_controller = placement(
        profile, controller_of(inventory), bool(gateways), MONITORING_GROUP
    )
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
        models,
        tuple(_node_exporter(profile, h, instances, gateways, monitoring) for h in hosts),
    )


def _instances(profile: Profile, inventory: Inventory, spec: ServedModel) -> list[Instance]:
    """A model's instances: host by host in inventory order, each host's in pool order."""
    on = {pool: {h.name for h in pool_hosts(inventory, spec, pool)} for pool, _ in spec.pools.items()}
    return [
        _instance(profile, spec, host, pool)
        for host in inventory.hosts.values()
        for pool in on
        if host.name in on[pool]
    ]


def _instance(profile: Profile, spec: ServedModel, host: Host, pool: str) -> Instance:
    pool_spec = spec.pools.get(pool)
    kv = spec.kv_transfer
    # None for the colocated pool and non-NIXL connectors
    sc_port = spec.side_channel_port_for(pool, profile.vllm.version)
    sc_host = None
    if sc_port is not None:
        sc_host = host.address if kv.side_channel_host == "auto" else kv.side_channel_host
    boot = spec.bootstrap_port_for(pool)
    return Instance(
        pool, host.name, host.address, pool_spec.port, tuple(pool_spec.gpus), pool_spec.kv_role, sc_host,
        sc_port, boot, spec.name, spec.listed, spec.kv_events_port_for(pool),
        spec.kv_events_replay_port_for(pool),
    )  # fmt: skip


def _model(
    spec: ServedModel, instances: tuple[Instance, ...], gateway_hosts: tuple[Host, ...]
) -> ModelTopology:
    """A model's share of the topology: its instances and, if it disaggregates, a router per gateway host."""
    unit = f"vllm-router-{spec.name}-pd.service" if spec.listed else "vllm-router-pd.service"
    gw = spec.gateway
    routers = tuple(
        Router(spec.name, h.name, h.address, gw.router_port, gw.router_prometheus_port, unit)
        for h in (gateway_hosts if spec.has_router else ())
    )
    mine = tuple(i for i in instances if i.model == spec.name)
    return ModelTopology(spec.name, tuple(spec.aliases), mine, routers, spec.has_router)


def _gateway(profile: Profile, host: Host, models: tuple[ModelTopology, ...]) -> Gateway:
    gw = profile.gateway
    first = next((r for m in models if (r := m.router_on(host.name)) is not None), None)
    ca_file = None if isinstance(gw.tls, str) else str(Path(gw.tls.ca_file).expanduser())
    router, metrics = (None, None) if first is None else (first.port, first.metrics_port)
    return Gateway(host.name, host.address, gw.port, gw.admin_port, router, metrics, ca_file)


def _node_exporter(
    profile: Profile,
    host: Host,
    instances: tuple[Instance, ...],
    gateways: tuple[Gateway, ...],
    mon: tuple[Prometheus, ...],
) -> MetricsEndpoint:
    """A host's node exporter (job `node`) with the labels of what it runs: `role` and `pool` list its
    pools' roles, `gateway`, `prometheus` and its gateway pools, comma-separated (absent: it runs none)."""
    mine = [i for i in instances if i.host == host.name]
    roles = [*dict.fromkeys(i.pool for i in mine)]
    roles += ["gateway"] * any(g.host == host.name for g in gateways)
    roles += ["prometheus"] * any(p.host == host.name for p in mon)
    pools = [*dict.fromkeys(GATEWAY_POOL[i.pool] for i in mine)]
    labels = {"host": host.name, **({"role": ",".join(roles)} if roles else {})}
    labels |= {"pool": ",".join(pools)} if pools else {}
    port = profile.monitoring.node_exporter_port
    return MetricsEndpoint("node", host.name, host.address, port, MappingProxyType(labels))


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
