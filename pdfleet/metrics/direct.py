"""The `MetricsSource` over direct scrapes of /metrics endpoints, for a site without a monitoring host.

Each query scrapes every target once more and compares with the newest earlier scrape that is at least
the window old, so a figure "over the last 60 s" needs a scrape from 60 s ago: call `scrape()` when the
window starts (bench does, before its load). Target labels (pool, role, host) join each sample's own
labels the way Prometheus attaches them (a clashing scraped label becomes `exported_<name>`), so
`by=("pool",)` groups the same on both sources.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from pdfleet.metrics.source import (
    MetricsUnavailable,
    Result,
    SeriesAbsent,
    bucket_quantile,
    check_labels,
    check_metric,
    check_quantile,
    check_window,
    describe,
    without_nan,
)

Labels = frozenset[tuple[str, str]]
# how far a baseline may be younger than the window asks (scrapes are not exactly on time)
SLACK_FRACTION = 0.1
SLACK_MIN_S = 1.0
HISTORY_S = 3600.0  # scrapes older than this are dropped


@dataclass(frozen=True)
class Target:
    """One /metrics endpoint and the labels Prometheus would attach to it (job, pool, role, host...)."""

    url: str  # the full URL, /metrics included
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Scrape:
    """Every sample of every target at one moment: (sample name, labels) -> value."""

    at: float  # the clock's time (monotonic by default)
    samples: Mapping[tuple[str, Labels], float]


def parse_exposition(text: str, target_labels: Mapping[str, str]) -> dict[tuple[str, Labels], float]:
    """Samples of a Prometheus text exposition with the target's labels attached."""
    out: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            for name in list(labels):
                if name in target_labels:
                    labels[f"exported_{name}"] = labels.pop(name)
            labels.update(target_labels)
            key = (sample.name, frozenset(labels.items()))
            out[key] = out.get(key, 0.0) + float(sample.value)
    return out


def _matches(labels: Labels, match: Mapping[str, str] | None) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in (match or {}).items())


def _group(labels: Labels, by: Sequence[str]) -> tuple[str, ...]:
    have = dict(labels)
    return tuple(have.get(name, "") for name in by)


class DirectScrape:
    """Reads `targets` directly; keeps its own scrape history to compute windowed figures."""

    def __init__(
        self, targets: Sequence[Target], timeout: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.targets = tuple(targets)
        self.timeout = timeout
        self.clock = clock
        self.history: list[Scrape] = []

    def _fetch(self, target: Target) -> str:
        try:
            with urllib.request.urlopen(target.url, timeout=self.timeout) as resp:
                return resp.read().decode("utf-8", errors="replace")
        except urllib.error.HTTPError as err:
            raise MetricsUnavailable(f"{target.url} answered HTTP {err.code}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise MetricsUnavailable(f"{target.url} is not answering ({reason})") from None

    def scrape(self) -> Scrape:
        """Scrape every target now and keep the result (MetricsUnavailable if one does not answer)."""
        samples: dict[tuple[str, Labels], float] = {}
        for target in self.targets:
            try:
                parsed = parse_exposition(self._fetch(target), target.labels)
            except ValueError as err:
                raise MetricsUnavailable(
                    f"{target.url} did not answer in Prometheus's text format ({err})"
                ) from None
            samples.update(parsed)
        now = self.clock()
        snap = Scrape(now, samples)
        self.history = [s for s in self.history if now - s.at <= HISTORY_S] + [snap]
        return snap

    def _window(self, window_s: float) -> tuple[Scrape, Scrape]:
        """(baseline, now): a fresh scrape and the newest earlier one at least about window_s old."""
        window = check_window(window_s)
        earlier = list(self.history)
        end = self.scrape()
        shortest = max(window - max(SLACK_MIN_S, SLACK_FRACTION * window), window / 2)
        old_enough = [s for s in earlier if end.at - s.at >= shortest]
        if not old_enough:
            oldest = f"the oldest is {end.at - earlier[0].at:.0f} s old" if earlier else "there is none"
            raise SeriesAbsent(
                f"direct scrape: no earlier scrape {window} s ago to compare with ({oldest}); "
                "scrape() when the window starts"
            )
        return old_enough[-1], end

    @staticmethod
    def _present(snap: Scrape, name: str, match: Mapping[str, str] | None) -> None:
        if not any(n == name and _matches(lab, match) for n, lab in snap.samples):
            raise SeriesAbsent(f"no target exports {describe(name, match)}")

    @staticmethod
    def _deltas(
        start: Scrape, end: Scrape, name: str, match: Mapping[str, str] | None
    ) -> dict[Labels, float]:
        """Increase per series between two scrapes; a counter that fell was reset and counts from 0."""
        out = {}
        for (n, labels), value in end.samples.items():
            if n != name or not _matches(labels, match):
                continue
            before = start.samples.get((n, labels), 0.0)
            out[labels] = value - before if value >= before else value
        return out

    def quantile(
        self,
        q: float,
        histogram: str,
        window_s: float,
        by: Sequence[str] = (),
        match: Mapping[str, str] | None = None,
    ) -> Result:
        check_quantile(q)
        check_labels(by, match)
        buckets_name = check_metric(histogram) + "_bucket"
        start, end = self._window(window_s)
        self._present(end, buckets_name, match)
        groups: dict[tuple[str, ...], dict[float, float]] = {}
        for labels, delta in self._deltas(start, end, buckets_name, match).items():
            le = float(dict(labels)["le"])
            bucket = groups.setdefault(_group(labels, by), {})
            bucket[le] = bucket.get(le, 0.0) + delta
        result = {k: bucket_quantile(q, list(b.items())) for k, b in groups.items()}
        return without_nan(result, f"P{q * 100:g} of {describe(histogram, match)}", window_s)

    def _grown(
        self, counter: str, window_s: float, by: Sequence[str], match: Mapping[str, str] | None
    ) -> tuple[Result, float]:
        """Increase per group and the seconds between the two scrapes compared."""
        check_labels(by, match)
        check_metric(counter)
        start, end = self._window(window_s)
        self._present(end, counter, match)
        out: Result = {}
        for labels, delta in self._deltas(start, end, counter, match).items():
            key = _group(labels, by)
            out[key] = out.get(key, 0.0) + delta
        return out, end.at - start.at

    def increase(
        self, counter: str, window_s: float, by: Sequence[str] = (), match: Mapping[str, str] | None = None
    ) -> Result:
        return self._grown(counter, window_s, by, match)[0]

    def rate(
        self, counter: str, window_s: float, by: Sequence[str] = (), match: Mapping[str, str] | None = None
    ) -> Result:
        grown, span = self._grown(counter, window_s, by, match)
        return {k: v / span for k, v in grown.items()}

    def value(self, gauge: str, by: Sequence[str] = (), match: Mapping[str, str] | None = None) -> Result:
        check_labels(by, match)
        check_metric(gauge)
        snap = self.scrape()
        self._present(snap, gauge, match)
        out: Result = {}
        for (name, labels), v in snap.samples.items():
            if name == gauge and _matches(labels, match):
                key = _group(labels, by)
                out[key] = out.get(key, 0.0) + v
        return out
