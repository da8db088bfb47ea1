"""A direct scrape of one server's Prometheus text endpoint, for before/after deltas in tests and benches."""

from __future__ import annotations

import urllib.request


def scrape_metrics(url: str) -> dict[str, float]:
    """A server's /metrics as metric name -> value summed over label sets (enough for before/after deltas)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line and not line.startswith("#"):
                name = line.split("{", 1)[0].split(" ", 1)[0]
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
