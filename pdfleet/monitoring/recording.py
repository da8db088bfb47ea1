"""The request chain as Prometheus recording rules, on vLLM's real metric names for the pinned release.

vLLM's histograms carry no length class, so its figures are per pool (`colocated`, `disagg`) and role
(`prefill`, `decode`, `colocated`: prefill and decode instances apart). Every per-pool figure also keeps
the `model` label (issue 24: a profile may serve several models, each with its own pools; vLLM targets
carry their model's name, the gateway's series their model group's), so one model's colocated pool never
merges with another's; the recorded names do not spell it (`pool_role:...` keeps `model` as well).
Per length class come the gateway's own histograms (TTFT, chunk gaps, request time, stalls), which it
labels with the class; a vLLM pool figure is a class figure only while the active stage sends that pool
one class (e.g. `long-prompts`: the disaggregated pool serves long prompts only). Bench, rollout, doctor
and `invoke monitor` read the recorded names from here, never spelling them again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.model.monitoring import KVTransferSeries, kv_transfer_series
from pdfleet.model.profile import Profile

QUANTILES = (0.5, 0.95, 0.99)
VLLM_BY = ("pool", "role")
GATEWAY_BY = ("pool", "length_class")
MODEL = "model"  # kept by every figure but the fleet-wide ones, never spelt in a recorded name


@dataclass(frozen=True)
class Step:
    """One link of the chain: a source histogram and the labels its quantiles are recorded by."""

    key: str  # short name used in recorded names and tables: ttft, queue, kv_transfer...
    title: str
    histogram: str
    by: tuple[str, ...]
    kv: bool = False  # the KV connector's histogram: the profile's connector and release decide its name
    also: tuple[str, ...] = ()  # further histograms recorded as this one (two P/D models, two connectors)

    @property
    def histograms(self) -> tuple[str, ...]:
        return (self.histogram, *self.also)

    @property
    def buckets(self) -> str:
        """The selector of its `_bucket` series: one histogram's name, or every one's by `__name__`."""
        if not self.also:
            return f"{self.histogram}_bucket"
        return '{__name__=~"' + "|".join(f"{h}_bucket" for h in self.histograms) + '"}'

    @property
    def level(self) -> str:
        return "_".join("class" if b == "length_class" else b for b in self.by)

    @property
    def source(self) -> str:
        return "gateway" if self.histogram.startswith("pdfleet_gateway_") else "vllm"

    @property
    def group(self) -> tuple[str, ...]:
        """The labels its recorded series keep: the model, then `by`."""
        return (MODEL, *self.by)

    def recorded(self, q: float) -> str:
        """The recorded series of one quantile, e.g. `pool_role:vllm_ttft_seconds:p95`."""
        return f"{self.level}:{self.source}_{self.key}_seconds:p{q * 100:g}"


CHAIN: tuple[Step, ...] = (
    Step("ttft", "TTFT at the gateway", "pdfleet_gateway_ttft_seconds", GATEWAY_BY),
    Step(
        "chunk_gap", "stream gap (ITL as the client sees it)", "pdfleet_gateway_chunk_gap_seconds", GATEWAY_BY
    ),
    Step("request", "request time at the gateway", "pdfleet_gateway_request_duration_seconds", GATEWAY_BY),
    Step("ttft", "TTFT in vLLM", "vllm:time_to_first_token_seconds", VLLM_BY),
    Step("queue", "queue time (WAITING)", "vllm:request_queue_time_seconds", VLLM_BY),
    Step("prefill", "prefill time", "vllm:request_prefill_time_seconds", VLLM_BY),
    Step("kv_transfer", "KV transfer (NIXL)", "vllm:nixl_xfer_time_seconds", VLLM_BY, kv=True),
    Step("decode", "decode time", "vllm:request_decode_time_seconds", VLLM_BY),
    Step("tpot", "TPOT per request", "vllm:request_time_per_output_token_seconds", VLLM_BY),
    Step("itl", "inter-token latency", "vllm:inter_token_latency_seconds", VLLM_BY),
    Step("e2e", "end-to-end latency in vLLM", "vllm:e2e_request_latency_seconds", VLLM_BY),
)


@dataclass(frozen=True)
class Figure:
    """A recorded rate, count or gauge: its name, the expression, and what it means."""

    name: str
    expr: str
    title: str
    gateway: bool = False  # needs a gateway (its metrics) in the topology
    index: bool = False  # needs the gateway's prefix index (kept only when the decider reads it)

    @property
    def labels(self) -> tuple[str, ...]:
        """The labels the series keeps: `model`, then what its name's level says (`pool_class:...` → pool,
        length_class); a `fleet:` figure keeps none."""
        level = self.name.split(":", 1)[0]
        if level == "fleet":
            return ()
        return (MODEL, *("length_class" if p == "class" else p for p in level.split("_")))


def _rate(counter: str, by: tuple[str, ...], window: str, per: int = 1, match: str = "") -> str:
    """A counter's rate summed per model and `by`."""
    scale = f"{per} * " if per != 1 else ""
    return f"{scale}sum by ({', '.join((MODEL, *by))}) (rate({counter}{match}[{window}]))"


def figures(window: str) -> tuple[Figure, ...]:
    """The chain's rates and gauges: requests, errors, fallbacks, stalls, routing, queues, KV cache."""
    gw = ("pool", "length_class")
    return (
        Figure(
            "pool_class:gateway_requests:rate",
            _rate("pdfleet_gateway_requests_total", gw, window),
            "requests/s through the gateway",
            gateway=True,
        ),
        Figure(
            "pool_class:gateway_errors:rate",
            _rate("pdfleet_gateway_requests_total", gw, window, match='{status=~"5.."}'),
            "5xx answers/s",
            gateway=True,
        ),
        Figure(
            "pool:gateway_stream_errors:rate",
            _rate("pdfleet_gateway_stream_errors_total", ("pool",), window),
            "streams cut after the first byte /s",
            gateway=True,
        ),
        Figure(
            "reason:gateway_fallbacks:rate",
            _rate("pdfleet_gateway_fallbacks_total", ("reason",), window),
            "fallbacks to colocated /s",
            gateway=True,
        ),
        Figure(
            "fleet:gateway_fallback:ratio",
            f"sum(rate(pdfleet_gateway_fallbacks_total[{window}])) / "
            f"clamp_min(sum(rate(pdfleet_gateway_requests_total[{window}])), 1e-9)",
            "fallbacks per request",
            gateway=True,
        ),
        Figure(
            "pool_class:gateway_stream_stalls:per_min",
            _rate("pdfleet_gateway_stream_stalls_total", gw, window, per=60),
            "stalls/min",
            gateway=True,
        ),
        Figure(
            "pool_class:gateway_chunk_gap_seconds:jitter",
            "pool_class:gateway_chunk_gap_seconds:p99 - pool_class:gateway_chunk_gap_seconds:p50",
            "stream jitter (gap P99 - P50)",
            gateway=True,
        ),
        Figure(
            "stage_class_pool_reason:gateway_routing_decisions:rate",
            _rate(
                "pdfleet_gateway_routing_decisions_total", ("stage", "length_class", "pool", "reason"), window
            ),
            "routing decisions/s",
            gateway=True,
        ),
        Figure(
            "reason:gateway_decisions:rate",
            _rate("pdfleet_gateway_decisions_total", ("reason",), window),
            "decisions/s by the decider's reason",
            gateway=True,
        ),
        Figure(
            "pool:gateway_prefix_estimate_cached_tokens:rate",
            _rate("pdfleet_gateway_prefix_estimate_cached_tokens_total", ("pool",), window),
            "prefix-cached prompt tokens/s, the gateway's estimate (vs vLLM's hits below)",
            gateway=True,
            index=True,
        ),
        Figure(
            "pool_role:vllm_prefix_cache_hits:rate",
            _rate("vllm:prefix_cache_hits_total", VLLM_BY, window),
            "prefix-cache hit tokens/s in vLLM",
        ),
        Figure(
            "pool_role:vllm_requests:rate",
            _rate("vllm:request_success_total", VLLM_BY, window),
            "finished requests/s in vLLM",
        ),
        Figure(
            "pool_role:vllm_num_requests_running:sum",
            "sum by (model, pool, role) (vllm:num_requests_running)",
            "running",
        ),
        Figure(
            "pool_role:vllm_num_requests_waiting:sum",
            "sum by (model, pool, role) (vllm:num_requests_waiting)",
            "waiting",
        ),
        Figure(
            "pool_role:vllm_kv_cache_usage_perc:max",
            "max by (model, pool, role) (vllm:kv_cache_usage_perc)",
            "KV cache usage (busiest instance)",
        ),
        Figure(
            "pool_role:vllm_num_preemptions:per_min",
            _rate("vllm:num_preemptions_total", VLLM_BY, window, per=60),
            "preemptions/min",
        ),
        Figure(
            "pool_role:vllm_prompt_tokens:rate",
            _rate("vllm:prompt_tokens_total", VLLM_BY, window),
            "prompt tokens/s",
        ),
        Figure(
            "pool_role:vllm_generation_tokens:rate",
            _rate("vllm:generation_tokens_total", VLLM_BY, window),
            "generated tokens/s",
        ),
    )


KV_TITLES = {"NixlConnector": "NIXL", "MooncakeConnector": "Mooncake"}


def kv_failed_figure(series: KVTransferSeries) -> str:
    """The recorded name of a connector's failed transfers/s: `pool_role:vllm_nixl_failed_transfers:rate`."""
    prefix = series.histogram.removeprefix("vllm:").split("_", 1)[0]
    return f"pool_role:vllm_{prefix}_failed_transfers:rate"


def kv_figures(series: KVTransferSeries, window: str) -> tuple[Figure, ...]:
    """The connector's failure counters as one rate (Mooncake's sender and receiver failures together).

    Each counter is summed on its own and the sums added: one `rate({__name__=~"a|b"})` over two counters of
    one instance drops their names and fails (`vector cannot contain metrics with the same labelset`), and
    vLLM registers both on every Mooncake instance. A group with only one of them keeps that one's rate."""
    if not series.failed:
        return ()
    rates = [_rate(f"{name}_total", VLLM_BY, window) for name in series.failed]
    expr = rates[0] if len(rates) == 1 else " + ".join(rates) + "".join(f" or {r}" for r in rates)
    return (Figure(kv_failed_figure(series), expr, "failed KV transfers/s"),)


def kv_series(profile: Profile) -> KVTransferSeries | None:
    """The KV-transfer series of a single-model profile, or of one model's view of a profile
    (`profile.for_model(spec)`) (None: not P/D, or the release registers none)."""
    if not profile.disaggregated:
        return None
    return kv_transfer_series(profile.kv_transfer.connector, profile.vllm.version)


def kv_series_of(profile: Profile) -> list[KVTransferSeries]:
    """The KV-transfer series every P/D model of the profile exports, each its own connector's (NIXL's on
    the decode instances, Mooncake's on the prefill ones), once per connector, in model order."""
    found: list[KVTransferSeries] = []
    for spec in profile.served:
        series = kv_series(profile.for_model(spec))
        if series is not None and series not in found:
            found.append(series)
    return found


def window_of(profile: Profile) -> str:
    return f"{profile.monitoring.rule_window_s}s"


def chain_steps(profile: Profile, has_gateway: bool) -> list[Step]:
    """The chain's steps this deployment has data for (no gateway steps without a gateway; the KV step on
    each P/D model's connector's own histogram: two models on two connectors record one series from both
    histograms, apart by `model`; none where the release registers none)."""
    kv = kv_series_of(profile)
    steps = []
    for step in CHAIN:
        if not has_gateway and step.source == "gateway":
            continue
        if step.kv:
            if not kv:
                continue
            titles = ", ".join(KV_TITLES.get(s.connector, s.connector) for s in kv)
            also = tuple(s.histogram for s in kv[1:])
            step = Step(step.key, f"KV transfer ({titles})", kv[0].histogram, step.by, kv=True, also=also)
        steps.append(step)
    return steps


def chain_figures(profile: Profile, has_gateway: bool) -> list[Figure]:
    """The rates and gauges this deployment has data for (the prefix estimate only where the decider keeps
    its index: no other gateway counts it)."""
    window = window_of(profile)
    index = profile.gateway.decider.reads_cache
    found = [f for f in figures(window) if (has_gateway or not f.gateway) and (index or not f.index)]
    for series in kv_series_of(profile):
        found += list(kv_figures(series, window))
    return found


def quantile_expr(step: Step, q: float, window: str) -> str:
    """histogram_quantile over the fleet's buckets, grouped by the step's labels and the model."""
    return (
        f"histogram_quantile({q:g}, sum by ({', '.join(['le', *step.group])}) "
        f"(rate({step.buckets}[{window}])))"
    )


def recording_rules(profile: Profile, has_gateway: bool) -> dict[str, object]:
    """The rules file: quantiles of every chain step first (jitter reads them), then the figures."""
    window = window_of(profile)
    interval = f"{profile.monitoring.evaluation_interval_s}s"
    quantiles = [
        {"record": step.recorded(q), "expr": quantile_expr(step, q, window)}
        for step in chain_steps(profile, has_gateway)
        for q in QUANTILES
    ]
    rates = [{"record": f.name, "expr": f.expr} for f in chain_figures(profile, has_gateway)]
    return {
        "groups": [
            {"name": "pdfleet-chain-quantiles", "interval": interval, "rules": quantiles},
            {"name": "pdfleet-chain-rates", "interval": interval, "rules": rates},
        ]
    }


def recorded_names(profile: Profile, has_gateway: bool) -> set[str]:
    """Every series the recording rules produce."""
    names = {s.recorded(q) for s in chain_steps(profile, has_gateway) for q in QUANTILES}
    return names | {f.name for f in chain_figures(profile, has_gateway)}
