"""A direct scrape of one server's Prometheus text endpoint, for before/after deltas in tests and benches.

The exposition is read by the same parser as `pdfleet.metrics.direct` (windowed figures over scrapes).
"""

from __future__ import annotations

import ssl
import urllib.request

from pdfleet.metrics.direct import parse_exposition


def _samples(url: str, tls: ssl.SSLContext | None = None) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of url/metrics: (name, labels, value); `tls` verifies an https server (a TLS gateway)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10, context=tls) as resp:
        text = resp.read().decode()
    return [(name, dict(labels), value) for (name, labels), value in parse_exposition(text, {}).items()]


def scrape_metrics(url: str, tls: ssl.SSLContext | None = None) -> dict[str, float]:
    """A server's /metrics as metric name -> value summed over label sets (enough for before/after deltas);
    `tls`: the context an https server is verified with (pdfleet.gateway.tls.client_context)."""
    out: dict[str, float] = {}
    for name, _, value in _samples(url, tls):
        out[name] = out.get(name, 0.0) + value
    return out


def scrape_histogram(url: str, name: str) -> dict[float, float]:
    """One histogram of a server's /metrics: bucket upper bound (`le`, +Inf too) -> cumulative count.

    Summed over the other labels' sets, like scrape_metrics.
    """
    out: dict[float, float] = {}
    for sample, labels, value in _samples(url):
        if sample == name + "_bucket":
            le = float(labels["le"])
            out[le] = out.get(le, 0.0) + value
    return out
