"""Prometheus metrics of the gateway, all named `pdfleet_gateway_*`, in a registry per gateway instance.

`model` is the request's model group (the pdfleet model name; an alias without a group: the alias; `-`
before an alias is known), so a per-model rollout gate or dashboard selects one model and every
fleet-wide reader sums it away. Its values come from the policy only: the label set stays bounded.
`pool` is colocated, disagg, or outside (an alias served by an outside endpoint).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

# TTFT spans sub-ms (short prompts on an idle simulator) to tens of seconds (long prefills queued)
# The rollout's gates compare P99s read from these (1.5x the colocated pool's, the SLO): between 0.1 s
# and 5 s a bucket is at most ~25% wider than the one below, so an estimate is off by less than a gate's
# margin; with 1 s → 2.5 s buckets a single 1.1 s request read as a 2.4 s P99.
TTFT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.6,
    0.75,
    0.9,
    1,
    1.25,
    1.5,
    1.75,
    2,
    2.5,
    3,
    4,
    5,
    7.5,
    10,
    20,
    40,
    80,
)
# inter-chunk gaps: one decode step is ~5-50 ms; the "typewriter stopped" region is 0.25-0.5 s and up
GAP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.75,
    1,
    1.5,
    2,
    3,
    5,
    10,
)
PROMPT_TOKEN_BUCKETS = (64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
DURATION_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    1.5,
    2,
    2.5,
    3,
    4,
    5,
    7.5,
    10,
    15,
    20,
    30,
    60,
    120,
    300,
)


# effective prompt tokens (what the instance still has to prefill) per shadow series: bounded labels
LENGTH_BINS: tuple[tuple[int, str], ...] = (
    (2048, "0-2k"),
    (8192, "2k-8k"),
    (16384, "8k-16k"),
    (32768, "16k-32k"),
)
LAST_BIN = "32k+"


def length_bin(tokens: int) -> str:
    """The effective-length bin of a request's shadow series."""
    for below, name in LENGTH_BINS:
        if tokens < below:
            return name
    return LAST_BIN


class GatewayMetrics:
    """Every metric the gateway exports; one instance per gateway (no global registry)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # label values come from the policy (aliases, pools, classes) and HTTP statuses: a bounded set
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self.registry
        self.requests = Counter(
            "pdfleet_gateway_requests",
            "Every response, by model ('-': none known), pool, prompt length class and HTTP status",
            ["model", "pool", "length_class", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "pdfleet_gateway_ttft_seconds",
            "Time from request received to first streamed chunk from upstream",
            ["model", "pool", "length_class"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.chunk_gap = Histogram(
            "pdfleet_gateway_chunk_gap_seconds",
            "Gap between consecutive streamed chunks from upstream",
            ["model", "pool", "length_class"],
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.stalls = Counter(
            "pdfleet_gateway_stream_stalls",
            "Streamed gaps longer than the policy's stall_threshold_ms (the typewriter stopped)",
            ["model", "pool", "length_class"],
            registry=r,
        )
        self.fallbacks = Counter(
            "pdfleet_gateway_fallbacks",
            "Requests retried on the colocated pool: the disaggregated pool failed before the first byte",
            ["model", "length_class", "reason"],
            registry=r,
        )
        self.decisions = Counter(
            "pdfleet_gateway_routing_decisions",
            "Routing decisions by model, its stage, length class, chosen pool and reason",
            ["model", "stage", "length_class", "pool", "reason"],
            registry=r,
        )
        self.decided = Counter(
            "pdfleet_gateway_decisions",
            "Routed requests by model and the decider's one reason (forced_header, stage_weight, short, "
            "cached_prefix, prefill_busy, decode_busy, endpoint_not_carried, no_pd_pool, fallback)",
            ["model", "reason"],
            registry=r,
        )
        # the prefix index's estimate beside the engines' own vllm:prefix_cache_queries/hits (issue 32)
        self.estimated_prompt = Counter(
            "pdfleet_gateway_prefix_estimate_prompt_tokens",
            "Prompt tokens of the requests the gateway's prefix index estimated, by model, pool and "
            "upstream (host:port of the colocated instance or the P/D router they were routed to)",
            ["model", "pool", "upstream"],
            registry=r,
        )
        self.estimated_cached = Counter(
            "pdfleet_gateway_prefix_estimate_cached_tokens",
            "Of those, the tokens the index estimated the upstream had cached (compare with the "
            "instances' vllm:prefix_cache_hits: colocated ones, the P/D pool's prefill ones)",
            ["model", "pool", "upstream"],
            registry=r,
        )
        self.kv_event_problems = Counter(
            "pdfleet_gateway_kv_events_problems",
            "KV-events feed problems by instance (host:port) and kind: gap (batches missed), gap_closed "
            "(missed, then replayed whole from the engine's replay socket), unreadable, disconnected; "
            "after any but gap_closed the instance counts nothing cached until its feed is whole again",
            ["upstream", "kind"],
            registry=r,
        )
        self.prompt_tokens = Histogram(
            "pdfleet_gateway_prompt_tokens",
            "Estimated prompt tokens per routed request",
            ["model"],
            buckets=PROMPT_TOKEN_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "pdfleet_gateway_request_duration_seconds",
            "Whole request time through the gateway, by pool and length class",
            ["model", "pool", "length_class"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.stream_errors = Counter(
            "pdfleet_gateway_stream_errors",
            "Responses cut after the first byte (upstream error or timeout); ended with an error event",
            ["model", "pool", "reason"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "pdfleet_gateway_client_disconnects",
            "Requests whose client went away before the response ended (upstream closed at once)",
            ["pool"],
            registry=r,
        )
        self.limit_rejections = Counter(
            "pdfleet_gateway_limit_rejections",
            "Requests refused by a per-key limit, by key name (never the key) and reason "
            "(rate, concurrency: 429; prompt_tokens: 400)",
            ["key", "reason"],
            registry=r,
        )
        self.kept_colocated = Counter(
            "pdfleet_gateway_kept_colocated",
            "Requests the stage would send to the disagg pool, kept on the colocated pool because the "
            "disagg pool's router cannot carry their endpoint",
            ["model", "endpoint", "reason"],
            registry=r,
        )
        self.long_prefill_overlaps = Counter(
            "pdfleet_gateway_long_prefill_overlaps",
            "Colocated streams that decoded while their own instance was prefilling a long prompt (the "
            "gateway sent it and had no first byte yet), by the stream's length class",
            ["model", "length_class"],
            registry=r,
        )
        self.long_prefill_stalls = Counter(
            "pdfleet_gateway_long_prefill_stalls",
            "Colocated streams' stalls (gaps over stall_threshold_ms) during which their own instance was "
            "prefilling a long prompt: the stalls moving long prompts to the P/D pool would remove",
            ["model", "length_class"],
            registry=r,
        )
        self._shadow_metrics(r)
        self.in_flight = Gauge(
            "pdfleet_gateway_in_flight_requests", "Requests being proxied now", ["model", "pool"], registry=r
        )
        self.reloads = Counter(
            "pdfleet_gateway_policy_reloads",
            "Policy reload attempts by result (ok, rejected)",
            ["result"],
            registry=r,
        )
        self.policy = Info(
            "pdfleet_gateway_policy", "The active policy's version, stage and file hash", registry=r
        )
        self.tls_expiry = Gauge(
            "pdfleet_gateway_tls_certificate_expiry_timestamp_seconds",
            "When the certificate the listeners present lapses (Unix seconds; 0: plain HTTP)",
            registry=r,
        )

    def _shadow_metrics(self, r: CollectorRegistry) -> None:
        """Shadow traffic's own families (issue 33): each shadowed request's figures on both sides,
        `shadow="true"` (the copy sent to the other pool, answer thrown away) and `shadow="false"` (the
        client's own request), by class and effective-length bin. Separate names, not a label on the
        primary families, so the rollout's gates and the recording rules never count a shadow."""
        by = ["model", "pool", "length_class", "length_bin", "shadow"]
        self.shadow_requests = Counter(
            "pdfleet_gateway_shadow_requests",
            "Shadowed requests by side; outcome ok, error (the upstream failed or answered >= 500), "
            "cancelled (dropped mid-flight: reload or stop)",
            [*by, "outcome"],
            registry=r,
        )
        self.shadow_ttft = Histogram(
            "pdfleet_gateway_shadow_ttft_seconds",
            "Shadowed requests' time from arrival to first streamed chunk, by side",
            by,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.shadow_chunk_gap = Histogram(
            "pdfleet_gateway_shadow_chunk_gap_seconds",
            "Shadowed requests' gaps between streamed chunks, by side",
            by,
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.shadow_stalls = Counter(
            "pdfleet_gateway_shadow_stream_stalls",
            "Shadowed requests' gaps over stall_threshold_ms, by side",
            by,
            registry=r,
        )
        self.shadow_duration = Histogram(
            "pdfleet_gateway_shadow_request_duration_seconds",
            "Shadowed requests' whole time, by side",
            by,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.shadow_dropped = Counter(
            "pdfleet_gateway_shadow_dropped",
            "Shadows not sent or cut, by reason (concurrency, shadow_queue, primary_pressure, "
            "shadow_unhealthy, reload, stopped)",
            ["model", "reason"],
            registry=r,
        )
        self.shadow_in_flight = Gauge(
            "pdfleet_gateway_shadow_in_flight", "Shadow requests out now", registry=r
        )
        self.shadow_share = Gauge(
            "pdfleet_gateway_shadow_share_percent",
            "The running shadow's share of its stage's classes (0: shadowing is off)",
            registry=r,
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """The labelled child of a metric, cached: `labels()` validates and locks on every call."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def count_estimate(self, model: str, pool: str, candidate: str, tokens: int, cached: int) -> None:
        """One request's prompt tokens and the index's estimate of them cached on its candidate (a URL)."""
        upstream = candidate.partition("://")[2].rstrip("/") or candidate
        self.child(self.estimated_prompt, model, pool, upstream).inc(tokens)
        self.child(self.estimated_cached, model, pool, upstream).inc(cached)

    def count_kv_event_problem(self, candidate: str, kind: str) -> None:
        """One problem of an instance's KV-events feed (the instance's base URL)."""
        upstream = candidate.partition("://")[2].rstrip("/") or candidate
        self.child(self.kv_event_problems, upstream, kind).inc()

    def set_policy(self, version: int, stage: str, sha256: str, tls_expiry: datetime | None = None) -> None:
        """Publish the active policy as the info metric, and the certificate's expiry when TLS is on."""
        self.policy.info({"version": str(version), "stage": stage, "sha256": sha256})
        if tls_expiry is not None:
            self.tls_expiry.set(tls_expiry.timestamp())

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
