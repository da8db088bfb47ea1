"""Prometheus metrics under vLLM's real names, cheap enough to observe once per token.

Durations are SIMULATED seconds (what the GPU would have shown), whatever --sim-time-scale is.
Histograms are plain bucket arrays (bisect per observation) exported through a custom collector on a
per-server registry, so 500 streams × ~100 tokens/s cost little CPU and nothing is global.
Bucket bounds are the facts table's (read from each release's loggers.py and connector stats).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.model.vllm_releases import Release
from pdfleet.sim import more_metrics
from pdfleet.sim.engine import Engine

# The simulator's own lateness, in wall seconds (not a vLLM metric).
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def one_two_five(limit: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to limit (vLLM's token-count buckets)."""
    out: list[float] = []
    mag = 1
    while True:
        for m in (1, 2, 5):
            v = m * mag
            if v > limit:
                return tuple(out)
            out.append(float(v))
        mag *= 10


# vLLM's histogram names and help texts ([VLLM-PD §3]) → the SimMetrics field holding the samples.
REQUEST_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", "ttft"),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", "itl"),
    (
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        "tpot",
    ),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", "e2e"),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", "queue"),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", "prefill"),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", "decode"),
    (
        "vllm:request_inference_time_seconds",
        "Histogram of time spent in RUNNING phase for request.",
        "inference",
    ),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", "prompt_tokens_hist"),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", "generation_tokens_hist"),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", "max_tokens_hist"),
)
# MooncakeConnector's (0.33, mooncake/stats.py): push-based, so P observes the histograms
MOONCAKE_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm:mooncake_xfer_time_seconds",
        "Histogram of transfer duration for Mooncake KV Cache transfers.",
        "mooncake_xfer",
    ),
    (
        "vllm:mooncake_bytes_transferred",
        "Histogram of bytes transferred per Mooncake KV Cache transfer.",
        "mooncake_bytes",
    ),
    (
        "vllm:mooncake_num_descriptors",
        "Histogram of number of descriptors per Mooncake KV Cache transfer.",
        "mooncake_descriptors",
    ),
)
MOONCAKE_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm:mooncake_num_failed_transfers",
        "Number of failed Mooncake KV Cache transfers.",
        "mooncake_failed",
    ),
    (
        "vllm:mooncake_num_failed_recvs",
        "Number of failed Mooncake KV Cache receives.",
        "mooncake_recvs",
    ),
    (
        "vllm:mooncake_num_kv_expired_reqs",
        "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
        "mooncake_expired",
    ),
)
# Histograms some releases register on every start: 0.11's deprecated TPOT (the inter-token latencies
# again), the tokens of each engine step, and 0.33's prompt tokens each request computed itself.
RELEASE_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds. DEPRECATED: use vllm:inter_token_latency_seconds.",
        "itl",
    ),
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", "iteration_tokens"),
    (
        "vllm:request_prefill_kv_computed_tokens",
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        "prefill_kv_computed",
    ),
)
NIXL_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    (
        "vllm:nixl_xfer_time_seconds",
        "Histogram of transfer duration for NIXL KV Cache transfers.",
        "nixl_xfer",
    ),
    (
        "vllm:nixl_post_time_seconds",
        "Histogram of transfer post time for NIXL KV Cache transfers.",
        "nixl_post",
    ),
    (
        "vllm:nixl_bytes_transferred",
        "Histogram of bytes transferred per NIXL KV Cache transfers.",
        "nixl_bytes",
    ),
    (
        "vllm:nixl_num_descriptors",
        "Histogram of number of descriptors per NIXL KV Cache transfers.",
        "nixl_descriptors",
    ),
)


@dataclass
class Hist:
    """A histogram: counts per bucket (last = +Inf) and the sum."""

    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def count_above(self, bound: float) -> int:
        """Observations above `bound` (a bucket bound: exact; otherwise those of the buckets above it)."""
        return sum(self.counts[bisect.bisect_left(self.buckets, bound) + 1 :])

    def cumulative(self) -> list[tuple[str, float]]:
        acc = 0
        out: list[tuple[str, float]] = []
        for bound, c in zip([*self.buckets, float("inf")], self.counts, strict=True):
            acc += c
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), acc))
        return out


def _buckets(release: Release, name: str) -> tuple[float, ...]:
    """A histogram's bounds as the release registers them (the last tabled release's where it has none,
    so the engine can still observe; such a release exports none of them)."""
    table = release if name in release.metric_names() else RELEASES[NEWEST]
    return tuple(float(b) for b in table.metric(name).buckets or ())


# The request histograms' bounds: the same in every tabled release (tests compare each one's export)
TTFT_BUCKETS = _buckets(RELEASES[NEWEST], "vllm:time_to_first_token_seconds")
ITL_BUCKETS = _buckets(RELEASES[NEWEST], "vllm:inter_token_latency_seconds")
REQUEST_BUCKETS = _buckets(RELEASES[NEWEST], "vllm:e2e_request_latency_seconds")
XFER_BUCKETS = _buckets(RELEASES[NEWEST], "vllm:nixl_xfer_time_seconds")


class SimMetrics:
    """All the numbers the server exports; the engine's own counters are read at scrape time."""

    def __init__(
        self,
        max_model_len: int,
        pd: bool,
        release: Release | None = None,
        mooncake: bool = False,
        consumer: bool = False,
    ) -> None:
        release = release or RELEASES[NEWEST]
        self.release = release
        self.consumer = consumer  # a kv_consumer: 0.33 registers vllm:num_requests_kv_fetch_by_stage
        # vllm:mooncake_* are MooncakePromMetrics' where the release registers them (0.33)
        self.mooncake = mooncake and "vllm:mooncake_xfer_time_seconds" in release.metric_names()
        # vllm:nixl_* are registered by NixlPromMetrics where the release has it (0.33; 0.11 logs only)
        self.pd = pd and "vllm:nixl_xfer_time_seconds" in release.metric_names()
        self.after_expiry = "vllm:nixl_num_notifications_after_expiry" in release.metric_names()
        self.expiry = "vllm:nixl_num_kv_expired_reqs" in release.metric_names()  # 0.33 (not 0.11.1/0.11.2)
        failed = next((m for m in release.metrics if m.name == "vllm:nixl_num_failed_transfers"), None)
        # 0.33's observe adds failed notifications to nixl_num_failed_transfers (0.11.x: apart)
        self.notification_is_failed_transfer = (
            failed is not None and "num_failed_notifications" in failed.counts
        )
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.tpot = Hist(ITL_BUCKETS)
        self.e2e = Hist(REQUEST_BUCKETS)
        self.queue = Hist(REQUEST_BUCKETS)
        self.prefill = Hist(REQUEST_BUCKETS)
        self.decode = Hist(REQUEST_BUCKETS)
        self.inference = Hist(REQUEST_BUCKETS)
        self.prompt_tokens_hist = Hist(one_two_five(max_model_len))
        self.generation_tokens_hist = Hist(one_two_five(max_model_len))
        self.max_tokens_hist = Hist(one_two_five(max_model_len))
        self.prefill_kv_computed = Hist(one_two_five(max_model_len))  # per request, computed here (0.33)
        self.iteration_tokens = Hist(_buckets(release, "vllm:iteration_tokens_total"))  # per engine step
        # a series per finish reason the release has, from the start (0.33 adds error and repetition)
        reasons = dict(release.metric("vllm:request_success").label_values)["finished_reason"]
        self.success: dict[str, int] = dict.fromkeys(reasons, 0)
        self.nixl_xfer = Hist(_buckets(release, "vllm:nixl_xfer_time_seconds"))
        self.nixl_post = Hist(_buckets(release, "vllm:nixl_post_time_seconds"))
        self.nixl_bytes = Hist(_buckets(release, "vllm:nixl_bytes_transferred"))
        self.nixl_descriptors = Hist(_buckets(release, "vllm:nixl_num_descriptors"))
        self.nixl_failed_transfers = 0
        self.nixl_failed_notifications = 0
        self.nixl_expired = 0
        self.nixl_after_expiry = 0  # a consumer's notification for blocks that had already expired
        self.mooncake_xfer = Hist(_buckets(release, "vllm:mooncake_xfer_time_seconds"))
        self.mooncake_bytes = Hist(_buckets(release, "vllm:mooncake_bytes_transferred"))
        self.mooncake_descriptors = Hist(_buckets(release, "vllm:mooncake_num_descriptors"))
        self.mooncake_failed = 0  # on P: a send that failed (the simulator's P never fails one)
        self.mooncake_recvs = 0  # on D: a receive that failed
        self.mooncake_expired = 0  # on P: held blocks no consumer read in time
        # simulator health: how far real time lags the simulated schedule
        self.steps = 0
        self.busy_sim_s = 0.0
        self.busy_wall_s = 0.0
        self.lag_s = 0.0
        self.max_lag_s = 0.0
        self.resyncs = 0
        self.resync_lost_s = 0.0
        self.step_lag = Hist(LAG_BUCKETS)  # per step: token emission behind its scheduled wall time
        self.loop_lag = Hist(LAG_BUCKETS)  # per probe: a timer's lateness, whatever blocked the loop
        self.window_lag_s = 0.0  # worst of both since the last lag warning
        self.prompt_counts_reused = 0  # consumer requests that took the producer's prompt count
        self.intake_wait_s = 0.0  # wall seconds steps waited for requests still in intake (host CPU)
        self.intake_missed_steps = 0  # steps scheduled while a request that arrived before them was in intake


class SimCollector(Collector):
    """Exports SimMetrics plus the engine's live gauges and token counters in Prometheus text format."""

    def __init__(
        self, metrics: SimMetrics, engine: Engine, model_name: str, cache_info: dict[str, str]
    ) -> None:
        self.m = metrics
        self.engine = engine
        self.labels = {"model_name": model_name, "engine": "0"}
        self.cache_info = cache_info

    def _hist(self, name: str, doc: str, h: Hist) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), h.cumulative(), h.total)
        return fam

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        fam = GaugeMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), value)
        return fam

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        fam = CounterMetricFamily(name, doc, labels=list(self.labels))
        fam.add_metric(list(self.labels.values()), value)
        return fam

    def collect(self) -> Iterator[Metric]:
        """Every family, read at scrape time (gauges live from the engine)."""
        m = self.m
        engine = self.engine
        yield self._gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", engine.num_running
        )
        yield self._gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", engine.num_waiting
        )
        yield self._gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", engine.kv_usage
        )
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=list(self.cache_info)
        )
        info.add_metric(list(self.cache_info.values()), 1.0)
        yield info
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", engine.num_preemptions
        )
        yield self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.", engine.prompt.total)
        # registered on every start (0 while caching is off), in tokens, as the release's loggers.py
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            engine.prefix_cache_queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            engine.prefix_cache_hits,
        )
        yield self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", engine.generation_tokens
        )
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*self.labels, "finished_reason"],
        )
        for reason, count in m.success.items():
            success.add_metric([*self.labels.values(), reason], count)
        yield success
        for name, doc, attr in REQUEST_HISTOGRAMS + RELEASE_HISTOGRAMS + (NIXL_HISTOGRAMS if m.pd else ()):
            if name in m.release.metric_names() or name.startswith("vllm:nixl_"):
                yield self._hist(name, doc, getattr(m, attr))
        yield from more_metrics.families(m.release, engine, self.labels, m.consumer)
        if m.pd:
            yield self._counter(
                "vllm:nixl_num_failed_transfers",
                "Number of failed NIXL KV Cache transfers.",
                m.nixl_failed_transfers,
            )
            yield self._counter(
                "vllm:nixl_num_failed_notifications",
                "Number of failed NIXL KV Cache notifications.",
                m.nixl_failed_notifications,
            )
            if m.expiry:
                yield self._counter(
                    "vllm:nixl_num_kv_expired_reqs",
                    "Number of requests that had their KV expire.",
                    m.nixl_expired,
                )
            if m.after_expiry:
                yield self._counter(
                    "vllm:nixl_num_notifications_after_expiry",
                    "Number of NIXL notifications received after the request's KV had expired.",
                    m.nixl_after_expiry,
                )
        if m.mooncake:
            for name, doc, attr in MOONCAKE_HISTOGRAMS:
                yield self._hist(name, doc, getattr(m, attr))
            for name, doc, attr in MOONCAKE_COUNTERS:
                yield self._counter(name, doc, getattr(m, attr))
        # not vLLM metrics: the simulator's own schedule-keeping, in wall seconds vs simulated seconds
        yield GaugeMetricFamily("pdfleet_sim_steps", "Engine steps run.", value=m.steps)
        yield GaugeMetricFamily(
            "pdfleet_sim_busy_simulated_seconds", "Simulated seconds spent in steps.", value=m.busy_sim_s
        )
        yield GaugeMetricFamily(
            "pdfleet_sim_busy_wall_seconds",
            "Wall seconds the step loop took for those steps.",
            value=m.busy_wall_s,
        )
        yield GaugeMetricFamily(
            "pdfleet_sim_max_lag_seconds",
            "Worst lateness of a step's token emission behind its scheduled wall time.",
            value=m.max_lag_s,
        )
        yield GaugeMetricFamily(
            "pdfleet_sim_resyncs",
            "Times the simulated clock fell too far behind and jumped.",
            value=m.resyncs,
        )
        yield GaugeMetricFamily(
            "pdfleet_sim_resync_lost_wall_seconds",
            "Wall seconds of schedule given up by those jumps.",
            value=m.resync_lost_s,
        )
        yield GaugeMetricFamily(
            "pdfleet_sim_lag_seconds",
            "Lateness of the latest step's token emission behind its scheduled wall time.",
            value=m.lag_s,
        )
        yield CounterMetricFamily(
            "pdfleet_sim_intake_wait_seconds",
            "Wall seconds steps waited, within their own length, for the intake (body, parse, tokenize, "
            "hash) of requests that arrived before them: host CPU kept out of simulated time.",
            value=m.intake_wait_s,
        )
        yield CounterMetricFamily(
            "pdfleet_sim_intake_missed_steps",
            "Steps scheduled while a request that arrived before them was still in intake (it joins a "
            "later step: host CPU in its simulated TTFT).",
            value=m.intake_missed_steps,
        )
        yield CounterMetricFamily(
            "pdfleet_sim_prompt_counts_reused",
            "P/D requests that took their prompt tokens from the producer (not tokenized again).",
            value=m.prompt_counts_reused,
        )
        for name, doc, hist in (
            (
                "pdfleet_sim_step_lag_seconds",
                "Per step, wall seconds its token emission ran behind its scheduled wall time.",
                m.step_lag,
            ),
            (
                "pdfleet_sim_loop_lag_seconds",
                "Wall seconds the event loop woke a periodic timer late (anything that blocked the loop).",
                m.loop_lag,
            ),
        ):
            fam = HistogramMetricFamily(name, doc)
            fam.add_metric([], hist.cumulative(), hist.total)
            yield fam


def make_registry(collector: SimCollector) -> CollectorRegistry:
    """A private registry holding only this server's metrics."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return reg
