"""The metrics client over Prometheus's HTTP API: instant and range queries, and the `MetricsSource` figures.

Every failure is a MetricsError that names the server and the query: connection refused or timed out
(MetricsUnavailable), a query Prometheus rejects (QueryError, with its own message), a series no target
exports (SeriesAbsent). An empty answer is never turned into a zero.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.metrics.source import (
    MetricsUnavailable,
    QueryError,
    Result,
    SeriesAbsent,
    check_labels,
    check_quantile,
    check_window,
    describe,
    selector,
    without_nan,
)


@dataclass(frozen=True)
class Sample:
    """One series of an instant query: its labels and its value (NaN allowed: Prometheus's own)."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Series:
    """One series of a range query: its labels and (unix time, value) points."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


def _number(text: str) -> float:
    """A sample value as Prometheus writes it ("NaN", "+Inf" included)."""
    return float(text)


class PrometheusClient:
    """A Prometheus server's HTTP API (`base_url` like http://10.0.0.5:9090), read-only."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    # ------------------------------------------------------------ HTTP

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        """The `data` of an API answer; raises MetricsUnavailable or QueryError with the server's words."""
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        what = params.get("query", path)
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as err:
            body = err.read()
            if err.code not in (400, 422, 503):
                raise MetricsUnavailable(
                    f"Prometheus at {self.base_url} answered HTTP {err.code} to {what}"
                ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise MetricsUnavailable(
                f"Prometheus at {self.base_url} is not answering ({reason}); is the "
                "monitoring host up (invoke provision --roles monitoring)?"
            ) from None
        try:
            doc = json.loads(body)
        except ValueError:
            raise MetricsUnavailable(
                f"{self.base_url} did not answer as Prometheus's API does (not JSON) to {what}"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error", "no reason given") if isinstance(doc, dict) else "no reason given"
            raise QueryError(f"Prometheus at {self.base_url} refused {what}: {error}")
        return doc.get("data")

    # ------------------------------------------------------------ raw queries

    def instant(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query (`/api/v1/query`); [] when nothing matches (the figures below raise instead)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        kind = data.get("resultType")
        if kind == "scalar":
            return [Sample({}, _number(data["result"][1]))]
        if kind != "vector":
            raise QueryError(f"{expr}: a {kind} result, expected an instant vector")
        return [Sample(dict(r["metric"]), _number(r["value"][1])) for r in data["result"]]

    def range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """A range query (`/api/v1/query_range`) from start to end (unix seconds) every step_s."""
        if not (end >= start and step_s > 0):
            raise QueryError(f"range {start}..{end} step {step_s}: needs end >= start and step > 0")
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        data = self._get("/api/v1/query_range", params)
        return [
            Series(dict(r["metric"]), tuple((float(t), _number(v)) for t, v in r["values"]))
            for r in data["result"]
        ]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (`/api/v1/targets`): labels, health, last error."""
        data = self._get("/api/v1/targets", {"state": "active"})
        return list(data.get("activeTargets", []))

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts (`/api/v1/alerts`)."""
        return list(self._get("/api/v1/alerts", {}).get("alerts", []))

    def ready(self) -> bool:
        """True when the server answers queries (a trivial one)."""
        try:
            self.instant("1")
        except MetricsUnavailable:
            return False
        return True

    # ------------------------------------------------------------ MetricsSource

    def grouped(self, expr: str, by: Sequence[str], what: str, at: float | None = None) -> Result:
        """An instant query's samples keyed by the `by` label values; SeriesAbsent when none."""
        samples = self.instant(expr, at)
        if not samples:
            raise SeriesAbsent(
                f"Prometheus at {self.base_url} has no series for {what} (not scraped, "
                "not exported by the pinned release, or a label matches nothing)"
            )
        out: Result = {}
        for s in samples:
            out[tuple(s.labels.get(name, "") for name in by)] = s.value
        return out

    def _ensure_exists(self, metric: str, match: Mapping[str, str] | None) -> None:
        """Raise SeriesAbsent when no target exports the series at all (not just no recent change)."""
        if not self.instant(f"count({selector(metric, match)})"):
            raise SeriesAbsent(
                f"Prometheus at {self.base_url} has no series {describe(metric, match)} "
                "(not scraped, or not exported by the pinned release)"
            )

    def quantile(
        self,
        q: float,
        histogram: str,
        window_s: float,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
        at: float | None = None,
    ) -> Result:
        check_quantile(q)
        check_labels(by, match)
        window = check_window(window_s)
        buckets = f"{histogram}_bucket"
        group = ", ".join(["le", *by])
        expr = f"histogram_quantile({q:g}, sum by ({group}) (rate({selector(buckets, match)}[{window}s])))"
        what = f"P{q * 100:g} of {describe(histogram, match)}"
        try:
            result = self.grouped(expr, by, what, at)
        except SeriesAbsent:
            self._ensure_exists(buckets, match)
            raise SeriesAbsent(f"{what}: no observation in the last {window} s") from None
        return without_nan(result, what, window)

    def rate(
        self,
        counter: str,
        window_s: float,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
        at: float | None = None,
    ) -> Result:
        return self._over_window("rate", counter, window_s, by, match, at)

    def increase(
        self,
        counter: str,
        window_s: float,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
        at: float | None = None,
    ) -> Result:
        return self._over_window("increase", counter, window_s, by, match, at)

    def _over_window(
        self,
        fn: str,
        counter: str,
        window_s: float,
        by: Sequence[str],
        match: Mapping[str, str] | None,
        at: float | None,
    ) -> Result:
        check_labels(by, match)
        window = check_window(window_s)
        expr = f"sum by ({', '.join(by)}) ({fn}({selector(counter, match)}[{window}s]))"
        what = f"{fn} of {describe(counter, match)} over {window} s"
        try:
            result = self.grouped(expr, by, what, at)
        except SeriesAbsent:
            self._ensure_exists(counter, match)
            # exported, but too few samples in the window to compute a rate (just started)
            raise SeriesAbsent(
                f"{what}: fewer than two samples in the window (scraped too recently)"
            ) from None
        return {k: v for k, v in result.items() if not math.isnan(v)}

    def value(
        self,
        gauge: str,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
        at: float | None = None,
    ) -> Result:
        check_labels(by, match)
        expr = f"sum by ({', '.join(by)}) ({selector(gauge, match)})"
        return self.grouped(expr, by, describe(gauge, match), at)
