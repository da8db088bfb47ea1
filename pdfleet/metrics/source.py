"""What every metrics reader offers (`MetricsSource`), its errors, and the pure pieces both readers share.

Bench, rollout and doctor read metrics only through a `MetricsSource`: Prometheus's HTTP API
(`pdfleet.metrics.prometheus`) or a direct scrape of the services' /metrics endpoints
(`pdfleet.metrics.direct`). A result maps the values of the `by` labels to a number; a series that
is absent, or a histogram with no observation in the window, is an error, never a zero.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Protocol

from pdfleet.errors import PdfleetError

# The values of the `by` labels, in order -> the number for that group.
Result = dict[tuple[str, ...], float]

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class MetricsError(PdfleetError):
    """Metrics could not be read; the message says which source and which series."""


class MetricsUnavailable(MetricsError):
    """The source did not answer (Prometheus down, an endpoint refusing connections, a timeout)."""


class SeriesAbsent(MetricsError):
    """No series matched, or a histogram had no observation in the window: there is no number to give."""


class QueryError(MetricsError):
    """The source refused the query (bad PromQL, bad arguments)."""


class MetricsSource(Protocol):
    """Windowed figures over metric series, grouped by labels (`pool`, `role`, `host`, `length_class`...)."""

    def quantile(
        self,
        q: float,
        histogram: str,
        window_s: float,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
    ) -> Result:
        """The q-quantile (0..1) of a histogram's observations in the last window_s seconds, per group."""
        ...

    def rate(
        self, counter: str, window_s: float, by: Sequence[str] = (), match: Mapping[str, str] | None = None
    ) -> Result:
        """Per-second increase of a counter (its exposed name, `_total` included) over the window."""
        ...

    def increase(
        self, counter: str, window_s: float, by: Sequence[str] = (), match: Mapping[str, str] | None = None
    ) -> Result:
        """How much a counter (or a histogram's `_count`) grew over the window, per group."""
        ...

    def value(self, gauge: str, by: Sequence[str] = (), match: Mapping[str, str] | None = None) -> Result:
        """A gauge's current value summed per group."""
        ...


def check_metric(name: str) -> str:
    """A metric name as PromQL and the exposition format allow it (else QueryError)."""
    if not _METRIC_NAME.match(name):
        raise QueryError(f"{name!r} is not a metric name (letters, digits, '_' and ':')")
    return name


def check_labels(by: Sequence[str], match: Mapping[str, str] | None) -> None:
    """Label names in `by` and `match` must be label names (else QueryError)."""
    for name in [*by, *(match or {})]:
        if not _LABEL_NAME.match(name) or name == "le":
            raise QueryError(f"{name!r} is not a label name to group or match by")


def check_quantile(q: float) -> None:
    """0 <= q <= 1, as histogram_quantile takes it."""
    if not 0.0 <= q <= 1.0:
        raise QueryError(f"quantile {q} is outside 0..1 (P95 is 0.95)")


def check_window(window_s: float) -> int:
    """The window in whole seconds (at least 1)."""
    if not math.isfinite(window_s) or window_s < 1:
        raise QueryError(f"window {window_s!r} s is shorter than one second")
    return int(round(window_s))


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal of any text (backslash, quote and newline escaped)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def selector(metric: str, match: Mapping[str, str] | None = None) -> str:
    """`metric{a="x",b="y"}` with every value escaped, so no label value can change the query."""
    check_metric(metric)
    check_labels((), match)
    if not match:
        return metric
    inner = ",".join(f"{k}={promql_string(v)}" for k, v in sorted(match.items()))
    return f"{metric}{{{inner}}}"


def describe(metric: str, match: Mapping[str, str] | None) -> str:
    """How errors name a series: the selector."""
    return selector(metric, match)


def bucket_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over (upper bound, cumulative count) pairs, +Inf last.

    Linear interpolation inside the bucket holding the rank; the first bucket starts at 0; a rank in the
    +Inf bucket gives the highest finite bound. NaN when the histogram holds no observation.
    """
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return math.nan
    # cumulative counts must not fall (scrape races can make them): Prometheus makes them monotonic
    counts, top = [], 0.0
    for _, count in ordered:
        top = max(top, count)
        counts.append(top)
    total = counts[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    index = next(i for i, c in enumerate(counts) if c >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0] if len(ordered) > 1 else math.nan
    upper = ordered[index][0]
    lower = 0.0 if index == 0 else ordered[index - 1][0]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    if index == 0 and upper <= 0:
        return upper
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def without_nan(result: Result, what: str, window_s: float) -> Result:
    """The groups that have a number; SeriesAbsent when none has (no observation in the window)."""
    kept = {k: v for k, v in result.items() if not math.isnan(v)}
    if not kept:
        raise SeriesAbsent(f"{what}: no observation in the last {window_s:g} s")
    return kept
