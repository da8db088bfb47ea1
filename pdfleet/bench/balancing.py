"""The report's "Colocated balancing" section (`invoke bench --colocated-choice`, issue 26): per balancing
choice of the colocated pool, what the guide talks about (short streams' stalls and worst gaps, with the
same-instance overlaps behind them) and what balancing can cost (the long prompts' TTFT), each later
choice against the first; the figures are results.py's `colocated_choices`."""

from __future__ import annotations

from typing import Any

from pdfleet.bench.overlap import confidence_note
from pdfleet.bench.stats import fmt

CHOICES = [
    "colocated choice",
    "short streams",
    "overlapped a long prefill on their instance",
    "stalls/100 streams",
    "stalls in those",
    "worst gap ms",
    "ITL P99.9 ms",
    "long prompts",
    "long TTFT P95 ms",
    "long TTFT P99 ms",
]


def choice_rows(doc: dict[str, Any]) -> list[list[str]]:
    """--colocated-choice: per balancing choice, the short streams' figures and the long prompts' TTFT."""
    rows = []
    for choice, f in doc.get("colocated_choices", {}).items():
        if "error" in f:
            rows.append([choice, *["-"] * (len(CHOICES) - 1)])
            continue
        rows.append(
            [
                choice,
                fmt(f["short_streams"]),
                fmt(f["overlapped_same_instance"]),
                fmt(f["stalls_per_100_streams"]),
                fmt(f["overlapped_stalls"]),
                fmt(f["worst_gap_ms"], 0),
                fmt(f["short_p99.9_itl_ms"]),
                fmt(f["long_requests"]),
                fmt(f["long_p95_ttft_ms"], 0),
                fmt(f["long_p99_ttft_ms"], 0),
            ]
        )
    return rows


def choice_notes(doc: dict[str, Any]) -> list[str]:
    """Each choice run's attribution, a LOW CONFIDENCE note where its overlaps are few, its error, and
    the later choices against the first (the one the headline and verdict show)."""
    figures = doc.get("colocated_choices", {})
    out = []
    for choice, f in figures.items():
        if "error" in f:
            out.append(f"{choice}: {f['error']}")
            continue
        out.append(f"{choice}: {f['attribution']}; {f['long_prefills']} long prefills in the run")
        warn = confidence_note(f"colocated ({choice})", f)
        if warn:
            out.append(f"LOW CONFIDENCE: {warn}")
    ok = [(c, f) for c, f in figures.items() if "error" not in f]
    if len(ok) > 1:
        (base, b), rest = ok[0], ok[1:]
        for choice, f in rest:
            out.append(
                f"{choice} against {base}: short streams' stalls per 100 streams "
                f"{fmt(f['stalls_per_100_streams'])} vs {fmt(b['stalls_per_100_streams'])}, ITL P99.9 "
                f"{fmt(f['short_p99.9_itl_ms'], 0)} vs {fmt(b['short_p99.9_itl_ms'], 0)} ms, long TTFT P95 "
                f"{fmt(f['long_p95_ttft_ms'], 0)} vs {fmt(b['long_p95_ttft_ms'], 0)} ms"
            )
    if figures:
        out.append(
            "each choice ran the same lengths and arrivals (prompts salted per run: no cache carried over); "
            f"the headline and verdict show the first, {next(iter(figures))}"
        )
    return out
