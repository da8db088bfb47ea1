"""`invoke plan`'s outputs, in `invoke bench`'s shape: plan.json (every figure), report.md and a
self-contained report.html (the Pareto plot inlined), written with bench's table and page helpers.

The document is built by `document` (pure: predictions and the decision in, plain data out); the files
and the plot come after.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdfleet.bench.report import fmt, html_document, html_table, img_tag, markdown_table
from pdfleet.plan.decide import Decision, Row
from pdfleet.plan.path import NOT_MODELLED, of_doc
from pdfleet.plan.space import Pruned

RANKED = [
    "rank",
    "layout",
    "TTFT P95 ms short/long",
    "TTFT P99",
    "TPOT P95 ms",
    "TPOT P99",
    "ITL P95 ms",
    "ITL P99 short/long",
    "short stalls/100",
    "goodput/s per GPU",
    "SLO attainment %",
    "KV link busy %",
    "loses because",
]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def _row_doc(row: Row) -> dict[str, Any]:
    """One ranked layout as plain data."""
    p = row.prediction
    keys = ("ttft", "tpot", "itl")
    figs = {f"p{q}_{k}_ms": _num(p.summary.get(f"p{q}_{k}_ms")) for k in keys for q in (95, 99)}
    classes = {
        c: {
            **{f"p{q}_{k}_ms": _num(s.get(f"p{q}_{k}_ms")) for k in keys for q in (95, 99)},
            "requests": int(s.get("completed", 0)) + int(s.get("failed", 0)),
            "stalls_per_100_streams": _num(s.get("stalls_per_100_streams")),
        }
        for c, s in p.classes.items()
    }
    return {
        "rank": row.rank,
        "layout": p.layout.name,
        "kind": p.layout.kind,
        "gpus": p.layout.gpus,
        "threshold": p.layout.threshold,
        # each pool's shape (what `invoke rebalance --to-plan` moves hosts toward; None: no such pool)
        "pools": {
            name: None
            if shape is None
            else {"instances": shape.instances, "tp": shape.tp, "budget": shape.budget}
            for name, shape in (
                ("prefill", p.layout.prefill),
                ("decode", p.layout.decode),
                ("colocated", p.layout.colocated),
            )
        },
        **figs,
        "classes": classes,
        "request_goodput_per_gpu": _num(p.per_gpu.get("request_goodput_per_gpu")),
        "request_throughput_per_gpu": _num(p.per_gpu.get("request_throughput_per_gpu")),
        "slo_attainment_pct": _num(p.summary.get("slo_attainment_pct")),
        "failed": int(p.summary.get("failed", 0)),
        "to_pd": p.to_pd,
        "queues_ms": {k: _num(v) for k, v in p.queues_ms.items()},
        "kv": {k: _num(v) for k, v in p.kv.items()},
        "misses": [str(m) for m in row.misses],
        "loses": row.loses,
    }


def document(
    header: dict[str, Any],
    decision: Decision,
    pruned: Sequence[Pruned],
    changes: dict[str, list[str]],
    warnings: Sequence[str],
) -> dict[str, Any]:
    """plan.json's content: the run's header, the ranked layouts, the cut ones, the recommendation."""
    rec = decision.recommended
    v = decision.verdict
    return {
        **header,
        "layouts": [_row_doc(r) for r in decision.rows],
        "pruned": [{"layout": c.layout.name, "reason": c.reason} for c in pruned],
        "recommended": None if rec is None else rec.prediction.layout.name,
        "why": decision.why,
        "verdict": None
        if v is None
        else {"decision": v.decision, "headline": v.headline, "deciding": v.deciding, "advice": v.advice},
        "changes": changes,
        "warnings": list(warnings),
    }


def _pair(c: dict[str, Any], key: str) -> str:
    """`short / long` cell of a per-class figure."""
    cells = [fmt(c.get(cls, {}).get(key), 0 if "ttft" in key else 1) for cls in ("short", "long")]
    return " / ".join(cells)


def ranked_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The ranked table's cells."""
    rows = []
    for r in doc["layouts"]:
        c = r["classes"]
        kv = r["kv"].get("kv_link_busy_pct")
        rows.append(
            [
                str(r["rank"]),
                r["layout"],
                _pair(c, "p95_ttft_ms"),
                fmt(r["p99_ttft_ms"], 0),
                fmt(r["p95_tpot_ms"]),
                fmt(r["p99_tpot_ms"]),
                fmt(r["p95_itl_ms"]),
                _pair(c, "p99_itl_ms"),
                fmt(c.get("short", {}).get("stalls_per_100_streams")),
                fmt(r["request_goodput_per_gpu"], 3),
                fmt(r["slo_attainment_pct"]),
                fmt(kv),
                r["loses"],
            ]
        )
    return rows


def path_text(d: dict[str, Any] | None) -> str:
    """plan.json's `request_path` as one line: its figures per route, where they came from and when."""
    return (of_doc(d) if d else NOT_MODELLED).text()


def _title(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    return (
        f"pdfleet plan: {doc['profile']}, {doc['gpus']} x {doc['hardware']['gpu']}, workload {w['name']} "
        f"at {fmt(doc['rate'], 2)} req/s for {fmt(doc['duration_s'], 0)} s, seed {doc['seed']}"
    )


def _sections(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(heading, bullet lines) of the recommendation, the verdict, the changes and the notes."""
    v = doc["verdict"]
    verdict = (
        []
        if v is None
        else [v["headline"], *[f"{k}: {fmt(val)}" for k, val in v["deciding"].items()], *v["advice"]]
    )
    t = doc["timing"]
    notes = [
        path_text(doc.get("request_path")),
        *doc["warnings"],
        f"{t['layouts']} layouts simulated, {fmt(t['simulated_s'], 0)} s of traffic each, in "
        f"{fmt(t['wall_s'], 1)} s on {t['workers']} worker(s) ({fmt(t['ratio'], 0)}x real time per layout)",
        f"targets: {', '.join(f'{k} {v:g}' for k, v in doc['targets'].items())}",
    ]
    return [
        ("Recommendation", [f"**{doc['recommended']}**", *doc["why"]]),
        ("Predicted verdict (the guide's rule)", verdict),
        ("Profile changes", doc["changes"]["profile"] or ["none"]),
        ("Inventory changes", doc["changes"]["inventory"] or ["none"]),
        ("Notes", notes),
    ]


def markdown(doc: dict[str, Any], plots: Sequence[Path]) -> str:
    """report.md's text."""
    lines = [f"# {_title(doc)}", ""]
    for heading, items in _sections(doc):
        lines += [f"## {heading}", "", *[f"- {i}" for i in items], ""]
    lines += ["## Ranked layouts", "", *markdown_table(RANKED, ranked_rows(doc)), ""]
    cut = [[c["layout"], c["reason"]] for c in doc["pruned"]]
    lines += [
        "## Cut before simulating",
        "",
        *(markdown_table(["layout", "reason"], cut) if cut else ["none"]),
        "",
    ]
    lines += ["## Plots", "", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)


def html_page(doc: dict[str, Any], plots: Sequence[Path]) -> str:
    """report.html: the same content, one file."""
    import html

    parts = [f"<h1>{html.escape(_title(doc))}</h1>"]
    for heading, items in _sections(doc):
        parts += [f"<h2>{html.escape(heading)}</h2><ul>"]
        parts += [f"<li>{html.escape(i.strip('*'))}</li>" for i in items] + ["</ul>"]
    parts += ["<h2>Ranked layouts</h2>", html_table(RANKED, ranked_rows(doc))]
    cut = [[c["layout"], c["reason"]] for c in doc["pruned"]]
    parts += [
        "<h2>Cut before simulating</h2>",
        html_table(["layout", "reason"], cut) if cut else "<p>none</p>",
    ]
    parts += ["<h2>Plots</h2>", *[img_tag(p) for p in plots]]
    return html_document(_title(doc), parts)


def write(out_dir: Path, doc: dict[str, Any]) -> list[Path]:
    """plan.json, the Pareto plot, report.md and report.html in out_dir; returns the files written."""
    from pdfleet.plan.plots import pareto  # matplotlib only when writing a report

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.json").write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    plots = [pareto(doc, out_dir)]
    (out_dir / "report.md").write_text(markdown(doc, plots), encoding="utf-8")
    (out_dir / "report.html").write_text(html_page(doc, plots), encoding="utf-8")
    return [out_dir / "plan.json", *plots, out_dir / "report.md", out_dir / "report.html"]
