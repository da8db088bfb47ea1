"""Benchmark statistics from raw timings, and the client-side figures `vllm bench serve` computes.

Primitives: percentiles (as np.percentile, linear), streams in flight, inter-token gaps, histogram
bounds. Names follow `vllm bench serve`: TTFT is send -> first streamed chunk (the client records it),
ITL is every gap between consecutive chunks of a stream (pooled over streams, so long streams weigh more).

`summarize` is vLLM's `calculate_metrics` over Records. Per successful request: TTFT (to the first
content event), E2E (to the last content event), TPOT = (E2E - TTFT) / (n - 1) with n =
usage.completion_tokens, only when n > 1 (0 for goodput when n <= 1); ITL pooled over requests. Keys are
vLLM's (`mean_ttft_ms`, `p99_itl_ms`, `request_goodput`, ...) so tools that read `vllm bench serve
--save-result` read ours. Added (not vLLM's): stalls (gaps over the profile's `slo.stall_ms`) per 100
streams, SLO attainment (failed requests count as bad), per-GPU rates. Times are divided by `scale`
(the simulator's time scale) so that they are what a GPU would show.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.bench.client import Record

NAN = float("nan")
PERCENTILES: tuple[float, ...] = (50, 90, 95, 99, 99.9)
# What `vllm bench serve --save-result` writes (results part; setup keys are added by results.py).
VLLM_RESULT_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
)


def pct_ms(sorted_s: Sequence[float], q: float) -> float:
    """The q-quantile of sorted seconds, in ms, as numpy.percentile's default (linear) computes it; NaN if
    empty.

    `vllm bench serve` takes its percentiles with np.percentile: the rank h = q * (n - 1) interpolated
    linearly between the elements at floor(h) and floor(h) + 1.
    """
    return 1000 * quantile(sorted_s, q)


def quantile(sorted_xs: Sequence[float], q: float) -> float:
    """numpy.percentile(xs, 100 * q) of sorted values (method "linear"); NaN if empty."""
    if not sorted_xs:
        return NAN
    h = q * (len(sorted_xs) - 1)
    lo = min(int(math.floor(h)), len(sorted_xs) - 1)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (h - lo) * (sorted_xs[hi] - sorted_xs[lo])


def mean_ms(xs: Sequence[float]) -> float:
    """The mean of seconds, in ms; NaN if empty."""
    return 1000 * sum(xs) / len(xs) if xs else NAN


def durations(records: Iterable[Record]) -> list[float]:
    """How long each finished stream took, in seconds (streams never started or never ended are left out)."""
    return [s.end - s.start for s in records if not math.isnan(s.start) and not math.isnan(s.end)]


def mean_in_flight(records: Iterable[Record], t0: float, t1: float, now: float) -> float:
    """Time-average of streams in flight over [t0, t1]; a stream still running counts until `now`."""
    total = 0.0
    for s in records:
        if math.isnan(s.start):  # never started (abandoned before its connect)
            continue
        end = now if math.isnan(s.end) else s.end
        total += max(0.0, min(end, t1) - max(s.start, t0))
    return total / (t1 - t0)


def itl(times: Sequence[float], scale: float = 1.0) -> list[float]:
    """One stream's inter-token latencies as vLLM bench defines ITL: the gaps between consecutive chunks
    (divided by `scale`)."""
    return [(b - a) / scale for a, b in zip(times, times[1:], strict=False)]


def itl_within(times: Sequence[float], start: float, end: float) -> list[float]:
    """The gaps of one stream whose both chunks arrived within [start, end]."""
    return [b - a for a, b in zip(times, times[1:], strict=False) if start <= a and b <= end]


def histogram_bound(before: Mapping[float, float], after: Mapping[float, float]) -> float:
    """The smallest bucket bound holding every observation made between two scrapes of one histogram.

    `before` and `after` map each bucket's upper bound (`le`, +Inf included) to its cumulative count.
    With nothing observed in between, that is the smallest bound.
    """
    total = after[math.inf] - before.get(math.inf, 0.0)
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0.0) >= total:
            return bound
    return math.inf


@dataclass(frozen=True)
class Bounds:
    """Per-request goodput bounds (vLLM's --goodput ttft:MS tpot:MS) and the stall gap, in ms."""

    ttft_ms: float
    tpot_ms: float
    stall_ms: float = 500.0


def pct_key(metric: str, p: float) -> str:
    """vLLM's key for a percentile: the number as written (99 -> p99_ttft_ms, 99.9 -> p99.9_ttft_ms)."""
    return f"p{int(p) if int(p) == p else p}_{metric}_ms"


def _std(xs: Sequence[float]) -> float:
    """np.std (population) of seconds."""
    if not xs:
        return math.nan
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def distribution(
    metric: str, xs_s: Sequence[float], percentiles: Sequence[float] = PERCENTILES
) -> dict[str, float]:
    """mean/median/std and each percentile of seconds, in ms, under vLLM's key names (NaN when empty)."""
    xs = sorted(xs_s)
    out = {
        f"mean_{metric}_ms": 1000 * sum(xs) / len(xs) if xs else math.nan,
        f"median_{metric}_ms": 1000 * quantile(xs, 0.5),
        f"std_{metric}_ms": 1000 * _std(xs),
    }
    for p in percentiles:
        out[pct_key(metric, p)] = 1000 * quantile(xs, p / 100)
    return out


def gaps(rec: Record, scale: float = 1.0) -> list[float]:
    """One request's ITLs in seconds: gaps between consecutive content events."""
    return itl(rec.chunks, scale)


def output_len(rec: Record) -> int:
    """n of TPOT: usage.completion_tokens, else (no usage event) the number of content events."""
    return rec.output_tokens if rec.output_tokens is not None else len(rec.chunks)


def tpot(rec: Record, scale: float = 1.0) -> float | None:
    """(E2E - TTFT) / (n - 1) in seconds; None when n <= 1 (vLLM leaves such requests out of TPOT)."""
    n = output_len(rec)
    if n <= 1:
        return None
    return (rec.latency - rec.ttft) / scale / (n - 1)


def good(rec: Record, bounds: Bounds, scale: float = 1.0) -> bool:
    """vLLM's goodput test: a successful request whose TTFT and TPOT (0 when n <= 1) are within bounds."""
    if not rec.success:
        return False
    t = tpot(rec, scale) or 0.0
    return rec.ttft / scale * 1000 <= bounds.ttft_ms and t * 1000 <= bounds.tpot_ms


def _peaks(done: Sequence[Record], scale: float) -> tuple[float, int]:
    """Max output tokens in any 1 s bin and max requests in flight at once (vLLM's two peak figures)."""
    if not done:
        return 0.0, 0
    t0 = min(r.start for r in done)
    bins: dict[int, int] = {}
    for r in done:
        for t in r.chunks:
            b = int((t - t0) / scale)
            bins[b] = bins.get(b, 0) + 1
    edges = sorted(
        [(r.start, 1) for r in done] + [(r.chunks[-1], -1) for r in done], key=lambda e: (e[0], e[1])
    )
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return float(max(bins.values(), default=0)), peak


def summarize(
    records: Iterable[Record],
    duration_s: float,
    bounds: Bounds,
    scale: float = 1.0,
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, float | int]:
    """vLLM's result figures over `records` (cancelled ones left out) and pdfleet's stalls and attainment.

    `duration_s` is the run's length in wall seconds (divided by `scale` here, like every time).
    """
    recs = [r for r in records if not r.cancelled]
    done = [r for r in recs if r.success]
    dur = duration_s / scale
    ttfts = [r.ttft / scale for r in done]
    e2els = [r.latency / scale for r in done]
    tpots = [t for r in done if (t := tpot(r, scale)) is not None]
    itls = [g for r in done for g in gaps(r, scale)]
    out_tokens = sum(output_len(r) for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    n_good = sum(good(r, bounds, scale) for r in recs)
    stall_s = bounds.stall_ms / 1000
    stalls = sum(1 for g in itls if g > stall_s)
    peak_tokens, peak_requests = _peaks(done, scale)
    out: dict[str, float | int] = {
        "duration": dur,
        "completed": len(done),
        "failed": len(recs) - len(done),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(done) / dur if dur > 0 else math.nan,
        "request_goodput": n_good / dur if dur > 0 else math.nan,
        "output_throughput": out_tokens / dur if dur > 0 else math.nan,
        "total_token_throughput": (in_tokens + out_tokens) / dur if dur > 0 else math.nan,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    for metric, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(distribution(metric, xs, percentiles))
    out["stalls"] = stalls
    out["stalls_per_100_streams"] = 100 * stalls / len(recs) if recs else math.nan
    out["streams_with_stall_pct"] = (
        100 * sum(any(g > stall_s for g in gaps(r, scale)) for r in done) / len(recs) if recs else math.nan
    )
    out["slo_attainment_pct"] = 100 * n_good / len(recs) if recs else math.nan
    out["good_requests"] = n_good
    return out


def per_gpu(summary: dict[str, float | int], gpus: int) -> dict[str, float]:
    """Rates per GPU, so that pools of unequal size compare fairly (DistServe reports goodput per GPU)."""
    keys = ("request_throughput", "request_goodput", "output_throughput", "total_token_throughput")
    return {f"{k}_per_gpu": float(summary[k]) / gpus if gpus else math.nan for k in keys}


def fmt(v: Any, digits: int = 1) -> str:
    """A number for a table ("-" when absent)."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else f"{v:.{digits}f}"
    return str(v)
