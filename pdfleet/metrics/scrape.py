"""A direct scrape of one server's Prometheus text endpoint, for before/after deltas in tests and benches."""

from __future__ import annotations

import urllib.request


def _samples(url: str) -> list[str]:
    """The sample lines of url/metrics (comments and blank lines left out)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return [line for line in resp.read().decode().splitlines() if line and not line.startswith("#")]


def scrape_metrics(url: str) -> dict[str, float]:
    """A server's /metrics as metric name -> value summed over label sets (enough for before/after deltas)."""
    out: dict[str, float] = {}
    for line in _samples(url):
        name = line.split("{", 1)[0].split(" ", 1)[0]
        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scrape_histogram(url: str, name: str) -> dict[float, float]:
    """One histogram of a server's /metrics: bucket upper bound (`le`, +Inf too) -> cumulative count.

    Summed over the other labels' sets, like scrape_metrics.
    """
    out: dict[float, float] = {}
    prefix = name + "_bucket{"
    for line in _samples(url):
        if line.startswith(prefix):
            le = float(line.split('le="', 1)[1].split('"', 1)[0])
            out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
