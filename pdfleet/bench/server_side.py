"""Server-side figures of one pool's run window, read only through a `MetricsSource` (Prometheus or a
direct scrape of the topology's metrics endpoints): the request chain (queue, prefill, decode), KV
transfer P95/P99 (from the histogram the pinned release's connector registers: NIXL's on decode,
Mooncake's on prefill; `model.monitoring.kv_transfer_series`), preemptions, the prefix-cache hit rate
and peak KV-cache usage, per pool and role; and the gateway decider's reasons over the window.

A figure the source cannot give (no observation, a series not exported, a source not answering) is kept
as its reason, never as a zero; the report prints the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from pdfleet.metrics.source import MetricsError, MetricsSource

# (figure, vLLM histogram) of the request chain, in the order a request goes through it; the KV transfer's
# histogram is the connector's on the pinned release (None here: `chain` is told which)
CHAIN: tuple[tuple[str, str | None], ...] = (
    ("queue", "vllm:request_queue_time_seconds"),
    ("prefill", "vllm:request_prefill_time_seconds"),
    ("kv_transfer", None),
    ("decode", "vllm:request_decode_time_seconds"),
)
NO_KV_HISTOGRAM = "n/a: the pinned vLLM release registers no KV-transfer histogram for this connector"
PREEMPTIONS = "vllm:num_preemptions_total"
# prompt tokens looked up in the prefix cache, and those found there (vLLM V1 counters, in tokens)
PREFIX_QUERIES, PREFIX_HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
DECIDED = "pdfleet_gateway_decisions_total"  # the gateway decider's one reason per routed request
QUANTILES = (0.95, 0.99)
Figure = float | str  # a number, or why there is none


def _try(read: Callable[[], Any]) -> Any:
    """A figure, or its source's reason for not having one."""
    try:
        return read()
    except MetricsError as err:
        return f"n/a: {err}"


def chain(
    source: MetricsSource, pool: str, window_s: float, kv_histogram: str | None
) -> dict[str, dict[str, Figure]]:
    """P95/P99 of each chain stage per role of `pool` (ms), preemptions and the KV-transfer tail read from
    `kv_histogram` (None: the release registers none for the connector, said as the figure's reason).

    Returns {"<stage>_p95_ms": {role: value or reason}, ..., "preemptions": {role: count}}.
    """
    out: dict[str, dict[str, Figure]] = {}
    match = {"pool": pool}
    for stage, metric in CHAIN:
        if stage == "kv_transfer" and pool == "colocated":
            continue  # no KV connector on a colocated pool
        histogram = kv_histogram if stage == "kv_transfer" else metric
        for q in QUANTILES:
            key = f"{stage}_p{int(q * 100)}_ms"
            if histogram is None:
                out[key] = {"*": NO_KV_HISTOGRAM}
                continue
            got = _try(partial(source.quantile, q, histogram, window_s, by=("role",), match=match))
            out[key] = {k[0]: 1000 * v for k, v in got.items()} if isinstance(got, dict) else {"*": got}
    got = _try(lambda: source.increase(PREEMPTIONS, window_s, by=("role",), match=match))
    out["preemptions"] = {k[0]: v for k, v in got.items()} if isinstance(got, dict) else {"*": got}
    out["prefix_cache_hit_pct"] = prefix_hits(source, window_s, match)
    return out


def prefix_hits(source: MetricsSource, window_s: float, match: dict[str, str]) -> dict[str, Figure]:
    """Per role, the share (%) of the prompt tokens looked up in the window that the prefix cache held."""
    queries = _try(lambda: source.increase(PREFIX_QUERIES, window_s, by=("role",), match=match))
    hits = _try(lambda: source.increase(PREFIX_HITS, window_s, by=("role",), match=match))
    for got in (queries, hits):
        if isinstance(got, str):
            return {"*": got}
    return {
        key[0]: 100 * hits.get(key, 0.0) / q if q > 0 else "n/a: no prompt token looked up in the window"
        for key, q in queries.items()
    }


def reasons(source: MetricsSource, window_s: float) -> dict[str, float] | str:
    """Requests the gateway decided over the window, per decider reason (or why there is no figure: a
    source of vLLM endpoints only, a gateway that routed nothing)."""
    got = _try(lambda: source.increase(DECIDED, window_s, by=("reason",)))
    return got if isinstance(got, str) else {key[0]: value for key, value in got.items()}


async def kv_peak(
    source: MetricsSource, pool: str, stop: asyncio.Event, every_s: float = 2.0
) -> dict[str, float | str]:
    """Sample KV-cache usage of `pool`'s instances until `stop`; the peak per role (0..1), in a thread so
    that a scrape never holds up the client's event loop. No read at all: {"error": the last reason}."""
    peak: dict[str, float] = {}
    errors: list[str] = []
    while True:
        try:
            got = await asyncio.to_thread(source.value, KV_USAGE, ("role", "host"), {"pool": pool})
            for (role, _host), v in got.items():
                peak[role] = max(peak.get(role, 0.0), v)
        except MetricsError as err:
            errors.append(str(err))
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            break
        except TimeoutError:
            continue
    found: dict[str, float | str] = {"error": errors[-1]} if not peak and errors else dict(peak)
    return found


def value_of(figures: dict[str, Figure], role: str | None = None) -> float | None:
    """The number of a chain figure for a role (the largest over roles when None); None when absent."""
    nums = {k: v for k, v in figures.items() if isinstance(v, float | int)}
    if role is not None:
        v = nums.get(role)
        return None if v is None else float(v)
    return max(nums.values()) if nums else None
