"""The vLLM metric families the stat logger registers on every start beyond the request chain: the P/D
ones first (0.33's prompt tokens by source, external prefix cache, waiting by reason, KV-fetch stages,
computed prefill tokens per request), 0.11's still-registered `time_per_output_token_seconds` and
`iteration_tokens_total`, and the ones a simulator has nothing to count for (at zero, as an idle vLLM
shows them). Each is exported only where the modelled release registers it (the facts table).

Label values are vLLM's own: `PromptTokenStats.ALL_SOURCES`, `CacheHitSource`, `WAITING_REASON_*`,
`KV_FETCH_STAGES`, `ADMISSION_REASONS` and the sleep states of v1/metrics/loggers.py and stats.py.
Registered but not exported here (per-request parameters the simulator does not keep):
`vllm:request_params_n`, `vllm:request_max_num_generation_tokens`, `vllm:request_num_preemptions`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pdfleet.model.vllm_releases import Release

CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")  # CacheHitSource
WAITING_REASONS = ("capacity", "deferred")  # WAITING_REASON_CAPACITY, WAITING_REASON_DEFERRED
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
NOT_EXPORTED = {
    "vllm:request_params_n",
    "vllm:request_max_num_generation_tokens",
    "vllm:request_num_preemptions",
}


def _labelled(
    kind: type[Any], name: str, doc: str, labels: dict[str, str], extra: str, values: Mapping[str, float]
) -> Metric:
    """One family with an extra label: a sample per value of it."""
    fam = kind(name, doc, labels=[*labels, extra])
    for value, count in values.items():
        fam.add_metric([*labels.values(), value], count)
    return fam


def families(release: Release, engine: Any, labels: dict[str, str], consumer: bool) -> Iterator[Metric]:
    """The families this release registers on every start (the KV-fetch stages on a consumer only)."""
    names = set(release.metric_names())
    prompt = engine.prompt
    if "vllm:prompt_tokens_by_source" in names:
        doc = "Number of prompt tokens by source."
        yield _labelled(
            CounterMetricFamily, "vllm:prompt_tokens_by_source", doc, labels, "source", prompt.by_source
        )
    if "vllm:prompt_tokens_cached" in names:
        fam = CounterMetricFamily(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens.", labels=list(labels)
        )
        fam.add_metric(list(labels.values()), prompt.cached)
        yield fam
    if "vllm:prompt_tokens_cached_by_source" in names:
        # the local prefix cache is on the device; a connector that reports no tier is external_unspecified
        by = dict.fromkeys(CACHE_HIT_SOURCES, 0)
        by["device"] = prompt.by_source["local_cache_hit"]
        by["external_unspecified"] = prompt.by_source["external_kv_transfer"]
        doc = "Number of cached prompt tokens by the tier their KV came from."
        yield _labelled(CounterMetricFamily, "vllm:prompt_tokens_cached_by_source", doc, labels, "source", by)
    for name, doc in (
        ("vllm:external_prefix_cache_queries", "External prefix cache queries, in terms of queried tokens."),
        ("vllm:external_prefix_cache_hits", "External prefix cache hits, in terms of cached tokens."),
    ):
        if name in names:  # the connector's lookups: every token a KV transfer supplied was asked and found
            fam = CounterMetricFamily(name, doc, labels=list(labels))
            fam.add_metric(list(labels.values()), prompt.by_source["external_kv_transfer"])
            yield fam
    if "vllm:num_requests_waiting_by_reason" in names:
        waiting = {"capacity": float(engine.num_waiting), "deferred": 0.0}  # sums to num_requests_waiting
        doc = "Number of waiting requests by reason."
        yield _labelled(
            GaugeMetricFamily, "vllm:num_requests_waiting_by_reason", doc, labels, "reason", waiting
        )
    if consumer and "vllm:num_requests_kv_fetch_by_stage" in release.metric_names(include_conditional=True):
        stages = {
            "waiting_to_start": 0.0,
            "in_progress": float(len(engine.loading)),
            "completed_waiting": 0.0,
        }
        doc = "Number of waiting requests by async KV load stage."
        yield _labelled(
            GaugeMetricFamily, "vllm:num_requests_kv_fetch_by_stage", doc, labels, "stage", stages
        )
    yield from _idle(names, labels)


def _idle(names: set[str], labels: dict[str, str]) -> Iterator[Metric]:
    """Families a simulator has nothing to count for, as an idle, awake vLLM exports them."""
    if "vllm:admission_rejections" in names:  # labelled by model_name and reason only
        fam = CounterMetricFamily(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            labels=["model_name", "reason"],
        )
        for reason in ADMISSION_REASONS:
            fam.add_metric([labels["model_name"], reason], 0)
        yield fam
    if "vllm:engine_sleep_state" in names:
        states = {state: float(state == "awake") for state in SLEEP_STATES}
        yield _labelled(
            GaugeMetricFamily, "vllm:engine_sleep_state", "Engine sleep state.", labels, "sleep_state", states
        )
    for name, doc in (
        ("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items."),
        ("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."),
    ):
        if name in names:
            fam = CounterMetricFamily(name, doc, labels=list(labels))
            fam.add_metric(list(labels.values()), 0)
            yield fam
