"""A dashboard panel and its queries, what the dashboard's rows are built from
(pdfleet.monitoring.dashboard turns them into Grafana's JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "s"
    description: str = ""
    # quantiles of a histogram whose first bucket ends here (s): a value under it shows as `<bound`
    first_bucket_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
