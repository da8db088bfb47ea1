"""Benchmark statistics from raw timings: percentiles, streams in flight, inter-token gaps, histogram bounds.

Names follow `vllm bench serve`: TTFT is send → first streamed chunk (the client records it), ITL is
every gap between consecutive chunks of a stream (pooled over streams, so long streams weigh more).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from pdfleet.bench.client import Span

NAN = float("nan")


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


def durations(spans: Iterable[Span]) -> list[float]:
    """How long each finished stream took, in seconds (streams never started or never ended are left out)."""
    return [s.end - s.start for s in spans if not math.isnan(s.start) and not math.isnan(s.end)]


def mean_in_flight(spans: Iterable[Span], t0: float, t1: float, now: float) -> float:
    """Time-average of streams in flight over [t0, t1]; a stream still running counts until `now`."""
    total = 0.0
    for s in spans:
        if math.isnan(s.start):  # never started (abandoned before its connect)
            continue
        end = now if math.isnan(s.end) else s.end
        total += max(0.0, min(end, t1) - max(s.start, t0))
    return total / (t1 - t0)


def itl(times: Sequence[float]) -> list[float]:
    """One stream's inter-token latencies as vLLM bench defines ITL: the gaps between consecutive chunks."""
    return [b - a for a, b in zip(times, times[1:], strict=False)]


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
