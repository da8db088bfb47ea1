"""A routed run (`invoke bench --pools routed`, issue 34): the requests go through the gateway's own routing,
no pool header, so each one's route is what the gateway says in its response: the pool that served it
(`X-Pdfleet-Pool`) and the decider's one reason (`X-Pdfleet-Decision`, issue 32's closed set). Pure: the
records in, per route and length class the figures `invoke bench` reports for a pool, and the rows of the
report's table.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import Any

from pdfleet.bench.client import Record
from pdfleet.bench.stats import Bounds, fmt, summarize

CLASSES = ("short", "long")
KEYS = ("p95_ttft_ms", "median_itl_ms", "p95_itl_ms", "p95_tpot_ms")
ROUTES = ["route (pool / reason)", "class", "requests", "failed", "TTFT P95 ms", "ITL P50 ms", "ITL P95 ms"]


def route_of(rec: Record) -> str:
    """`pool/reason` as the gateway said it (`none` where it said nothing: a request refused before)."""
    return f"{rec.served or 'none'}/{rec.decision or 'none'}"


def reason_counts(records: Sequence[Record]) -> dict[str, float]:
    """Requests per decider reason (the gateway's header; cancelled requests left out)."""
    out: dict[str, float] = {}
    for r in records:
        if not r.cancelled:
            out[r.decision or "none"] = out.get(r.decision or "none", 0.0) + 1
    return out


def route_figures(
    records: Sequence[Record], wall_s: float, bounds: Bounds, scale: float = 1.0
) -> dict[str, dict[str, Any]]:
    """Per route: its requests, and per length class the requests, failures and bench's figures (ms, the
    profile's time), routes in order of their request count."""
    by: dict[str, list[Record]] = {}
    for r in records:
        if not r.cancelled:
            by.setdefault(route_of(r), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for route, recs in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        classes = {}
        for cls in CLASSES:
            mine = [r for r in recs if r.length_class == cls]
            if mine:
                s = summarize(mine, wall_s, bounds, scale)
                classes[cls] = {"requests": len(mine), "failed": s["failed"], **{k: s[k] for k in KEYS}}
        out[route] = {"requests": len(recs), "classes": classes}
    return out


def route_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The report's rows: per routed run's route and class (none without a routed run)."""
    rows = []
    for s in doc["pools"].values():
        for route, r in s.get("pdfleet", {}).get("routes", {}).items():
            for cls, c in r["classes"].items():
                figs = [fmt(c["p95_ttft_ms"], 0), fmt(c["median_itl_ms"]), fmt(c["p95_itl_ms"])]
                rows.append([route, cls, str(c["requests"]), str(c["failed"]), *figs])
    return rows


def routing_notes(doc: dict[str, Any]) -> list[str]:
    """What the gateway routed the run by (its stage, weights and threshold, read from /admin/policy), and
    whether the bench set that stage for the run and put the previous one back."""
    r = doc.get("routing") or {}
    if not r:
        return []
    if "error" in r:
        return [f"the gateway's routing was not read: {r['error']}"]
    w = r["stage_percent_disagg"]
    whose = f"model group {r['group']}'s" if r.get("group") else "gateway"
    out = [
        f"{whose} stage {r['stage']} (to P/D: short {w['short']}%, long {w['long']}%), long_prompt_tokens "
        f"{r['long_prompt_tokens']} on {r['threshold_on']} tokens, policy version {r['version']}"
    ]
    if r.get("set_from"):
        out.append(f"the bench set this stage for the run; the gateway was put back to {r['set_from']}")
    return out


Table = Callable[[Sequence[str], Sequence[Sequence[str]]], Any]


def markdown_section(doc: dict[str, Any], table: Table) -> list[str]:
    """report.md's "Routes taken" (`table`: the report's markdown table); nothing without a routed run."""
    rows = route_rows(doc)
    if not rows:
        return []
    return ["## Routes taken", "", *table(ROUTES, rows), "", *[f"- {n}" for n in routing_notes(doc)], ""]


def html_section(doc: dict[str, Any], table: Table) -> list[str]:
    """report.html's "Routes taken" (`table`: the report's HTML table); nothing without a routed run."""
    rows = route_rows(doc)
    if not rows:
        return []
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in routing_notes(doc))
    return ["<h2>Routes taken</h2>", table(ROUTES, rows), f"<ul>{notes}</ul>"]
