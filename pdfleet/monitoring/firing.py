"""What is firing, from Alertmanager's API v2 (`GET /api/v2/alerts`): what `invoke monitor` prints under
the chain. An alert held back (inhibited) while its pool is down, or silenced, is counted, not listed;
an Alertmanager that does not answer is one line saying so (the chain above is still worth reading)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

from pdfleet.errors import ValidationError
from pdfleet.fleet.topology import Topology

SHOWN_LABELS = ("model", "pool", "role", "length_class", "host", "job")
SEVERITY_ORDER = {"critical": 0, "warning": 1}


@dataclass(frozen=True)
class Firing:
    """One alert Alertmanager holds: its name, severity, labels that say where, since when, summary."""

    name: str
    severity: str
    where: str
    since: str
    summary: str
    state: str  # active, suppressed (inhibited or silenced), unprocessed


def alertmanager_url(topology: Topology, override: str | None) -> str | None:
    """The Alertmanager to read: --alertmanager, else the one beside the topology's Prometheus (None: the
    inventory has no monitoring host)."""
    if override:
        parsed = urlparse(override)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValidationError(
                f"--alertmanager: {override!r} is not an http(s) URL like http://10.0.0.5:9093"
            )
        return override.rstrip("/")
    server = topology.prometheus
    return None if server is None or server.alertmanager is None else server.alertmanager.url


def parse_alerts(doc: Any) -> list[Firing]:
    """Alertmanager's /api/v2/alerts answer as Firing, critical first, then by name and place."""
    out = []
    for alert in doc if isinstance(doc, list) else []:
        labels = alert.get("labels") or {}
        where = " ".join(f"{k}={labels[k]}" for k in SHOWN_LABELS if labels.get(k))
        started = str(alert.get("startsAt", ""))
        try:
            since = datetime.fromisoformat(started.replace("Z", "+00:00")).strftime("%H:%M:%S UTC")
        except ValueError:
            since = started
        out.append(
            Firing(
                str(labels.get("alertname", "?")),
                str(labels.get("severity", "")),
                where,
                since,
                str((alert.get("annotations") or {}).get("summary", "")),
                str((alert.get("status") or {}).get("state", "")),
            )
        )
    return sorted(out, key=lambda f: (SEVERITY_ORDER.get(f.severity, 2), f.name, f.where))


def read_alerts(url: str, timeout: float = 5.0) -> list[Firing]:
    """Every alert Alertmanager holds now; a connection problem raises OSError (URLError included)."""
    with urllib.request.urlopen(f"{url}/api/v2/alerts", timeout=timeout) as resp:
        return parse_alerts(json.loads(resp.read()))


def format_firing(alerts: Sequence[Firing], url: str) -> str:
    """The alerts section: one line per active alert, and how many are held back."""
    active = [a for a in alerts if a.state == "active"]
    held = len(alerts) - len(active)
    note = f"; {held} held back (inhibited while their pool is down, or silenced)" if held else ""
    lines = [f"Alerts firing (Alertmanager {url}): {len(active) or 'none'}{note}"]
    for a in active:
        lines.append(f"  {a.severity or '-':8} {a.name}  {a.where}  since {a.since}")
        if a.summary:
            lines.append(f"      {a.summary}")
    return "\n".join(lines) + "\n"


def firing_section(url: str | None) -> str:
    """The alerts section for `invoke monitor` (a line saying why, when there is nothing to read)."""
    if url is None:
        return "Alerts: the inventory has no monitoring host (no Alertmanager)\n"
    try:
        return format_firing(read_alerts(url), url)
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"Alerts: Alertmanager at {url} does not answer ({reason})\n"
