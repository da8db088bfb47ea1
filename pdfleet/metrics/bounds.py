"""What a quantile read from a histogram can honestly say: the bucket it fell in.

Prometheus's histogram_quantile (and `source.bucket_quantile`, its copy) interpolates linearly inside
the bucket that holds the rank, the first bucket from 0. The histogram only knows the bucket, so the
interpolated figure is a guess inside it. It matters most in the first bucket: vLLM's request-time
histograms (queue, prefill, decode) start at 0.3 s, so any quantile there reads 150 / 285 / 297 ms
(P50 / P95 / P99) whatever the real times were. The one rule every reader applies (`invoke bench`,
`invoke monitor`, the dashboard, the rollout gates): a quantile in the first bucket is shown as
"<bound"; two figures in one bucket cannot be ordered, and a decision made on them says so.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pdfleet.gateway.metrics import DURATION_BUCKETS, GAP_BUCKETS, TTFT_BUCKETS
from pdfleet.model.vllm_release_data import NEWEST, RELEASES

# the vLLM histograms any reader takes quantiles of (the same bounds in every tabled release)
_VLLM = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:nixl_xfer_time_seconds",
    "vllm:mooncake_xfer_time_seconds",
)


def _vllm_bounds(name: str) -> tuple[float, ...]:
    return tuple(float(b) for b in RELEASES[NEWEST].metric(name).buckets or ())


# histogram name -> its finite upper bounds (seconds), ascending
BUCKETS: dict[str, tuple[float, ...]] = {
    "pdfleet_gateway_ttft_seconds": tuple(float(b) for b in TTFT_BUCKETS),
    "pdfleet_gateway_chunk_gap_seconds": tuple(float(b) for b in GAP_BUCKETS),
    "pdfleet_gateway_request_duration_seconds": tuple(float(b) for b in DURATION_BUCKETS),
    **{name: _vllm_bounds(name) for name in _VLLM},
}


@dataclass(frozen=True)
class Bucket:
    """The bucket a quantile fell in: (lower, upper], the first one from 0, the last one open."""

    lower: float
    upper: float  # math.inf for the +Inf bucket

    @property
    def first(self) -> bool:
        return self.lower == 0.0


def bucket_of(value: float, bounds: Sequence[float]) -> Bucket:
    """The bucket of `bounds` (finite upper bounds, ascending) that holds `value` (a bound belongs to the
    bucket it closes, as `le` says)."""
    i = bisect.bisect_left(bounds, value)
    lower = 0.0 if i == 0 else float(bounds[i - 1])
    upper = float(bounds[i]) if i < len(bounds) else math.inf
    return Bucket(lower, upper)


def first_bound(histogram: str) -> float | None:
    """The first bucket's upper bound of a known histogram (None: bounds unknown)."""
    bounds = BUCKETS.get(histogram)
    return bounds[0] if bounds else None


def below_first(value: float, bounds: Sequence[float]) -> bool:
    """Whether a quantile is an interpolation inside the first bucket: all it says is `< bounds[0]`.

    The first bucket's upper bound itself is a real figure (every observation at or under it), and
    a value at 0 says "no time at all" only when the bound is 0, which no histogram here has.
    """
    return bool(bounds) and value < bounds[0]


def same_bucket(a: float, b: float, bounds: Sequence[float]) -> bool:
    """Whether two figures fall in one bucket: the histogram cannot order them (either may be larger)."""
    return bool(bounds) and bucket_of(a, bounds) == bucket_of(b, bounds)


def show_ms(value_ms: float, bounds: Sequence[float], digits: int = 0) -> str:
    """A quantile in ms as a reader may print it: `<300` when it lies in the first bucket (`bounds` in
    seconds), else the figure."""
    if below_first(value_ms / 1000.0, bounds):
        return f"<{1000 * bounds[0]:.{digits}f}"
    return f"{value_ms:.{digits}f}"


def judgeable(threshold_s: float, bounds: Sequence[float]) -> float:
    """The lowest bound a quantile of this histogram can be held to: one inside the first bucket is
    raised to the bucket's upper bound (every quantile under it is the same interpolation, so an alert
    below it would fire on the shape of the bucket, not on the requests)."""
    return max(threshold_s, bounds[0]) if bounds else threshold_s
