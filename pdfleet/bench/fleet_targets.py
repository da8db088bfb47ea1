"""What `invoke bench` needs of a deployment: the gateway to send through, its client key, each pool's GPU
count, and the metrics source (Prometheus on the monitoring host when it answers, else a direct scrape of
the topology's metrics endpoints). Decided here from the one Topology; nothing recomputes addresses."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

from pdfleet.bench.compare import POOLS, PoolTarget
from pdfleet.bench.load import Gateway
from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import GATEWAY_POOL, Topology
from pdfleet.metrics.direct import DirectScrape, Target
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.metrics.source import MetricsSource
from pdfleet.model.profile import Profile


def read_client_key(path: str) -> str:
    """The gateway client key from its file on the control machine; never created here, never echoed."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ValidationError(
            f"no gateway client key at {file}: provision the gateway first (invoke provision --profile P)"
        )
    if stat.S_IMODE(file.stat().st_mode) & 0o077:
        raise ValidationError(
            f"{file}: a key file must be readable by its owner only; run `chmod 600 {file}`"
        )
    try:
        key = file.read_text().strip()
    except PermissionError:
        raise ValidationError(
            f"{file} is not readable by this user (the lab's keys are root's: use sudo)"
        ) from None
    if not key:
        raise ValidationError(f"{file}: the key file is empty")
    return key


def gateway_of(profile: Profile, topology: Topology, key: str) -> Gateway:
    """The first gateway of the topology, with the model alias clients use (an error when there is none)."""
    if not topology.gateways:
        why = topology.no_gateway_reason or "the inventory has no host in group gateway"
        raise ValidationError(
            f"profile {profile.name}: bench sends through the gateway, and there is none: {why}"
        )
    gw = topology.gateways[0]
    return Gateway(gw.address, gw.port, key, profile.gateway.model_alias or profile.model.id)


def pools_of(topology: Topology) -> tuple[str, ...]:
    """The gateway pools this topology has (colocated needs its instances; disagg a router)."""
    have = {GATEWAY_POOL[i.pool] for i in topology.instances}
    if not any(g.router_url for g in topology.gateways):
        have.discard("disagg")
    return tuple(p for p in POOLS if p in have)


def gpu_count(topology: Topology, pool: str) -> int:
    """GPUs a gateway pool uses: every instance's GPU indices (colocated; prefill + decode for disagg)."""
    return sum(len(i.gpus) for i in topology.instances if GATEWAY_POOL[i.pool] == pool)


def direct_targets(topology: Topology, pool: str | None = None) -> list[Target]:
    """The vLLM metrics endpoints (of one gateway pool, or all) with their pool/role/host labels.

    The router's endpoint is left out: it listens on its gateway host's loopback, out of reach from here.
    """
    return [
        Target(e.url, dict(e.labels))
        for e in topology.metrics_endpoints
        if e.job == "vllm" and (pool is None or e.labels.get("pool") == pool)
    ]


Sources = Callable[[str], tuple[MetricsSource, MetricsSource]]  # pool -> (window figures, KV sampling)


def metrics_sources(topology: Topology, note: Callable[[str], None]) -> tuple[Sources, str]:
    """Per pool: (source for windowed figures, source for KV sampling), and what they are.

    Prometheus on the monitoring host when it answers; else direct scrapes of the pool's own endpoints (one
    pool down leaves the other's figures alone), a fresh scraper for sampling so that its scrapes never
    become the window's baseline.
    """
    if topology.prometheus is not None:
        url = topology.prometheus.url
        prom = PrometheusClient(url, timeout=5)
        if prom.ready():
            return (lambda _pool: (prom, prom)), f"Prometheus at {url}"
        note(f"Prometheus at {url} is not answering; reading the services' /metrics directly")

    def direct(pool: str) -> tuple[MetricsSource, MetricsSource]:
        """Direct scrapers over one pool's endpoints."""
        targets = direct_targets(topology, pool)
        return DirectScrape(targets), DirectScrape(targets)

    return direct, f"direct scrape of {len(direct_targets(topology))} vLLM endpoint(s)"


def pool_targets(topology: Topology, pools: tuple[str, ...], sources: Sources) -> dict[str, PoolTarget]:
    """PoolTarget per pool asked for."""
    out = {}
    for p in pools:
        source, kv = sources(p)
        out[p] = PoolTarget(p, gpu_count(topology, p), source, kv)
    return out
