"""What `invoke bench` needs of a deployment: which model it compares, the gateway to send through, its
client key, each of that model's pools' GPU count, the KV-transfer histogram its connector registers on its
pinned release (the facts table: NIXL's, or Mooncake's), and the metrics source (Prometheus on the
monitoring host when it answers, else a direct scrape of the topology's metrics endpoints), narrowed to that
model's series. Decided here from the one Topology; nothing recomputes addresses."""

from __future__ import annotations

import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pdfleet.bench.compare import POOLS, ROUTED, PoolTarget
from pdfleet.bench.load import Gateway
from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import GATEWAY_POOL, Topology
from pdfleet.metrics.direct import DirectScrape, Target
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.metrics.source import MetricsSource, Result
from pdfleet.model.monitoring import kv_transfer_series
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel


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


def bench_model(profile: Profile, name: str | None) -> ServedModel:
    """The model whose pools the bench compares: `--model`, else the first disaggregated one (colocated
    against P/D is the comparison), else the first; an unknown name is refused naming the known ones."""
    served = profile.served
    if name is None:
        return next((spec for spec in served if spec.disaggregated), served[0])
    found = next((spec for spec in served if spec.name == name), None)
    if found is None:
        known = ", ".join(spec.name for spec in served)
        raise ValidationError(f"--model {name}: profile {profile.name} serves no such model; models: {known}")
    return found


def kv_histogram(profile: Profile, spec: ServedModel) -> str | None:
    """The KV-transfer histogram a model's P/D pool exports: its connector's on the pinned release, from the
    facts table (None: not P/D, or the release registers none, as 0.11.0 for NIXL)."""
    view = profile.for_model(spec)
    if not view.disaggregated:
        return None
    series = kv_transfer_series(view.kv_transfer.connector, view.vllm.version)
    return series.histogram if series is not None else None


def gateway_of(profile: Profile, topology: Topology, key: str, alias: str | None = None) -> Gateway:
    """The first gateway of the topology, with the alias clients name the model by (default: the profile's
    first alias); an error when there is none."""
    if not topology.gateways:
        why = topology.no_gateway_reason or "the inventory has no host in group gateway"
        raise ValidationError(
            f"profile {profile.name}: bench sends through the gateway, and there is none: {why}"
        )
    gw = topology.gateways[0]
    alias = alias or profile.gateway.model_alias or profile.model.id
    return Gateway(gw.address, gw.port, key, alias, gw.ca_file)


def pools_of(topology: Topology, model: str | None = None) -> tuple[str, ...]:
    """The gateway pools this topology has, of one model or (None) any (colocated needs its instances;
    disagg a router)."""
    have = {GATEWAY_POOL[i.pool] for i in topology.instances if model is None or i.model == model}
    routed = bool(topology.model(model).routers) if model else any(g.router_url for g in topology.gateways)
    if not routed:
        have.discard("disagg")
    return tuple(p for p in POOLS if p in have)


def gpu_count(topology: Topology, pool: str, model: str | None = None) -> int:
    """GPUs a gateway pool uses, of one model or (None) every model: every instance's GPU indices
    (colocated; prefill + decode for disagg)."""
    return sum(
        len(i.gpus)
        for i in topology.instances
        if GATEWAY_POOL[i.pool] == pool and (model is None or i.model == model)
    )


def instance_count(topology: Topology, pool: str, model: str | None = None) -> int:
    """Instances of a gateway pool (of one model, or every model's)."""
    return sum(
        1 for i in topology.instances if GATEWAY_POOL[i.pool] == pool and (model is None or i.model == model)
    )


def direct_targets(topology: Topology, pool: str | None = None, model: str | None = None) -> list[Target]:
    """The vLLM metrics endpoints (of one gateway pool and model, or all) with their pool/role/host/model
    labels.

    The router's endpoint is left out: it listens on its gateway host's loopback, out of reach from here.
    """
    return [
        Target(e.url, dict(e.labels))
        for e in topology.metrics_endpoints
        if e.job == "vllm"
        and (pool is None or e.labels.get("pool") == pool)
        and (model is None or e.labels.get("model") == model)
    ]


@dataclass(frozen=True)
class ModelSeries:
    """A metrics source narrowed to one model's series (the `model` label every vLLM target carries), so a
    pool's figures never mix in another model's instances of the same pool."""

    source: MetricsSource
    model: str

    def _match(self, match: Mapping[str, str] | None) -> dict[str, str]:
        return {**(match or {}), "model": self.model}

    def quantile(
        self,
        q: float,
        histogram: str,
        window_s: float,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
    ) -> Result:
        """The source's quantile over this model's series only."""
        return self.source.quantile(q, histogram, window_s, by, self._match(match))

    def rate(
        self, counter: str, window_s: float, by: Sequence[str] = (), match: Mapping[str, str] | None = None
    ) -> Result:
        """The source's rate over this model's series only."""
        return self.source.rate(counter, window_s, by, self._match(match))

    def increase(
        self, counter: str, window_s: float, by: Sequence[str] = (), match: Mapping[str, str] | None = None
    ) -> Result:
        """The source's increase over this model's series only."""
        return self.source.increase(counter, window_s, by, self._match(match))

    def value(self, gauge: str, by: Sequence[str] = (), match: Mapping[str, str] | None = None) -> Result:
        """The source's gauge over this model's series only."""
        return self.source.value(gauge, by, self._match(match))


Sources = Callable[[str], tuple[MetricsSource, MetricsSource]]  # pool -> (window figures, KV sampling)


def metrics_sources(
    topology: Topology, note: Callable[[str], None], model: str | None = None
) -> tuple[Sources, str]:
    """Per pool: (source for windowed figures, source for KV sampling), and what they are; with `model`,
    of that model's series only.

    Prometheus on the monitoring host when it answers; else direct scrapes of the pool's own endpoints (one
    pool down leaves the other's figures alone), a fresh scraper for sampling so that its scrapes never
    become the window's baseline.
    """
    if topology.prometheus is not None:
        url = topology.prometheus.url
        prom = PrometheusClient(url, timeout=5)
        if prom.ready():
            scoped: MetricsSource = prom if model is None else ModelSeries(prom, model)
            return (lambda _pool: (scoped, scoped)), f"Prometheus at {url}"
        note(f"Prometheus at {url} is not answering; reading the services' /metrics directly")

    def direct(pool: str) -> tuple[MetricsSource, MetricsSource]:
        """Direct scrapers over one pool's endpoints."""
        targets = direct_targets(topology, pool, model)
        return DirectScrape(targets), DirectScrape(targets)

    return direct, f"direct scrape of {len(direct_targets(topology, model=model))} vLLM endpoint(s)"


def pool_targets(
    topology: Topology,
    pools: tuple[str, ...],
    sources: Sources,
    model: str | None = None,
    kv_histogram: str | None = None,
) -> dict[str, PoolTarget]:
    """PoolTarget per pool asked for (of one model's instances, or every model's), the P/D pool's KV
    transfer read from `kv_histogram`."""
    out = {}
    for p in pools:
        if p == ROUTED:  # every pool of the model, the gateway deciding; the records carry the route taken
            gpus = sum(gpu_count(topology, q, model) for q in POOLS)
            out[p] = PoolTarget(p, gpus, None, None, instance_count(topology, "colocated", model))
            continue
        source, kv = sources(p)
        gpus, instances = gpu_count(topology, p, model), instance_count(topology, p, model)
        out[p] = PoolTarget(p, gpus, source, kv, instances, kv_histogram)
    return out
