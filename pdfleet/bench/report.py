"""The benchmarks' reports: Markdown tables and notes (every bench), and `invoke bench`'s `report.md` and
self-contained `report.html` (plots inlined as base64 PNG).

Headline table (TTFT P95, ITL P99, stalls per 100 streams, TPOT P95 per pool and length class), the
fair-comparison table (GPUs, per-GPU rates, goodput, SLO attainment), the server-side chain, the
verdict with the numbers that decided it, the client's own lateness, and every error counted.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pdfleet.bench import routes
from pdfleet.bench.balancing import CHOICES, choice_notes, choice_rows
from pdfleet.bench.overlap import confidence_note
from pdfleet.bench.server_side import CHAIN
from pdfleet.bench.stats import fmt
from pdfleet.bench.verdict import Verdict
from pdfleet.gateway.decider import reason_mix_text
from pdfleet.metrics.bounds import BUCKETS, show_ms

LATE_MS = 2.0  # the client's schedule lateness P99 above which the report says it was late
STAGES = ("queue", "prefill", "kv_transfer", "decode")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table's lines: the header, the separator, one line per row (cells as str())."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(c) for c in row) + " |" for row in rows),
    ]


def note(lead: str, items: Sequence[str], tail: str) -> list[str]:
    """A blank line and `note: LEAD ITEM; ITEM. TAIL` when there are items, else nothing."""
    if not items:
        return []
    return ["", f"note: {lead}" + "; ".join(items) + tail]


def headline_rows(doc: dict[str, Any]) -> list[list[str]]:
    """pool, class, requests, failed, TTFT P95, ITL P99, stalls/100 streams, TPOT P95 (per class and all)."""
    rows = []
    for pool, s in doc["pools"].items():
        if "error" in s:
            rows.append([pool, "all", "-", "-", "down", "-", "-", "-", "-"])
            continue
        for cls, c in [*s["pdfleet"]["classes"].items(), ("all", s)]:
            rows.append(
                [
                    pool,
                    cls,
                    fmt(c["completed"] + c["failed"]),
                    fmt(c["failed"]),
                    fmt(c["p95_ttft_ms"], 0),
                    fmt(c["p99_itl_ms"]),
                    fmt(c["p99.9_itl_ms"]),
                    fmt(c["stalls_per_100_streams"]),
                    fmt(c["p95_tpot_ms"]),
                ]
            )
    return rows


HEADLINE = [
    "pool",
    "class",
    "requests",
    "failed",
    "TTFT P95 ms",
    "ITL P99 ms",
    "ITL P99.9 ms",
    "stalls/100 streams",
    "TPOT P95 ms",
]


def fair_rows(doc: dict[str, Any]) -> list[list[str]]:
    """GPUs and per-GPU rates, goodput and attainment per pool."""
    rows = []
    for pool, s in doc["pools"].items():
        if "error" in s:
            rows.append([pool, fmt(s["gpus"]), "-", "-", "-", "-", "-"])
            continue
        g, gpus = s["pdfleet"]["per_gpu"], s["pdfleet"]["gpus"]
        best = s["pdfleet"].get("max_rate_meeting_slo")
        rows.append(
            [
                pool,
                fmt(gpus),
                fmt(s["request_throughput"], 2),
                fmt(g["request_throughput_per_gpu"], 2),
                fmt(g["request_goodput_per_gpu"], 2),
                fmt(s["slo_attainment_pct"]),
                "-" if best is None else f"{best:g} ({best / max(1, gpus):g}/GPU)",
            ]
        )
    return rows


FAIR = ["pool", "GPUs", "req/s", "req/s per GPU", "goodput/s per GPU", "SLO attainment %", "sweep: max rate"]


def server_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Per pool and role: P95/P99 of each chain stage, preemptions, prefix-cache hit rate (share of prompt
    tokens), peak KV usage (or why not)."""
    rows = []
    for pool, s in doc["pools"].items():
        if "error" in s:
            continue
        server, peak = s["pdfleet"]["server"], s["pdfleet"]["kv_cache_usage_peak"]
        kv = s["pdfleet"].get("kv_transfer_histogram")
        roles = sorted({r for v in server.values() for r in v if r != "*"}) or ["*"]
        for role in roles:
            cells = [pool, role]
            for st in STAGES:
                p95 = server.get(f"{st}_p95_ms", {}).get(role, server.get(f"{st}_p95_ms", {}).get("*"))
                p99 = server.get(f"{st}_p99_ms", {}).get(role, server.get(f"{st}_p99_ms", {}).get("*"))
                cells.append(_pair(p95, p99, kv if st == "kv_transfer" else dict(CHAIN)[st]))
            pre = server.get("preemptions", {}).get(role)
            cells.append(fmt(pre, 0) if isinstance(pre, int | float) else "-")
            hit = server.get("prefix_cache_hit_pct", {}).get(role)
            cells.append(f"{hit:.0f}%" if isinstance(hit, int | float) else "-")
            top = peak.get(role)
            cells.append(f"{100 * top:.0f}%" if isinstance(top, int | float) else "-")
            rows.append(cells)
    return rows


def _ms(v: float, histogram: str | None) -> str:
    """A server figure; inside its histogram's first bucket only "<bound" is known (`metrics.bounds`)."""
    return show_ms(v, BUCKETS.get(histogram or "", ()))


def _pair(p95: Any, p99: Any, histogram: str | None) -> str:
    """A P95 / P99 cell of the server table."""
    if not isinstance(p95, int | float):
        return "n/a"
    return (
        f"{_ms(p95, histogram)} / {_ms(p99, histogram)}"
        if isinstance(p99, int | float)
        else _ms(p95, histogram)
    )


def bucket_note(doc: dict[str, Any]) -> str:
    """Where the server figures' first buckets end: the request-time histograms', and each KV-transfer
    histogram the run read (its connector's)."""
    first = 1000 * BUCKETS[str(dict(CHAIN)["queue"])][0]
    note = (
        f"queue, prefill and decode come from vLLM's request-time histograms, whose first bucket ends at "
        f"{first:g} ms: '<{first:g}' is all they can say below it"
    )
    kv = sorted(
        {h for s in doc["pools"].values() if (h := s.get("pdfleet", {}).get("kv_transfer_histogram"))}
    )
    return note + "".join(
        f"; KV transfer's ({h}) first bucket ends at {1000 * BUCKETS[h][0]:g} ms" for h in kv if h in BUCKETS
    )


SERVER = [
    "pool",
    "role",
    "queue P95/P99 ms",
    "prefill",
    "KV transfer",
    "decode",
    "preemptions",
    "prefix-cache hits",
    "peak KV",
]


def server_notes(doc: dict[str, Any]) -> list[str]:
    """Why server figures are missing, once per distinct reason."""
    seen: dict[str, None] = {}
    for s in doc["pools"].values():
        for figs in s.get("pdfleet", {}).get("server", {}).values():
            for v in figs.values():
                if isinstance(v, str):
                    seen.setdefault(v, None)
    return list(seen)[:6]


REASONS = ["pool run", "the decider's reasons: share of the requests the gateway decided in the run's window"]
REASONS_NOTE = (
    "A pool run sends the pool header (`forced_header`) unless the gateway chose (bench/shadow_ab.py); the "
    "gateway counts every request it routed in the window, not only the bench's."
)


def reason_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Per pool run, the mix of the gateway decider's reasons (docs/gateway.md), or why there is none."""
    rows = []
    for pool, s in doc["pools"].items():
        mix = s.get("pdfleet", {}).get("decider_reasons")
        if mix is not None:  # none: a failed run, or results from before the mix
            rows.append([pool, reason_mix_text(mix) if isinstance(mix, dict) else str(mix)])
    return rows


def client_notes(doc: dict[str, Any]) -> list[str]:
    """The client's lateness per pool, and a warning when it was late (P99 > 2 ms)."""
    out = []
    for pool, s in doc["pools"].items():
        if "error" in s:
            continue
        c = s["pdfleet"]["client"]
        late = c.get("p99_schedule_lateness_ms")
        line = (
            f"{pool}: schedule lateness P99 {fmt(late, 2)} ms "
            f"(max {fmt(c.get('max_schedule_lateness_ms'), 1)}"
            f" ms), event-loop lag P99 {fmt(c.get('p99_loop_lag_ms'), 2)} ms"
        )
        if isinstance(late, int | float) and late > LATE_MS:
            line += f" -- THE CLIENT WAS LATE (P99 > {LATE_MS:g} ms): starts slipped behind the schedule"
        out.append(line)
    return out


SHORT = [
    "pool",
    "short streams",
    "overlapped a long prefill on their instance",
    "stalls/100 streams",
    "stalls in those",
    "worst gap ms",
    "ITL P99.9 ms",
]


def short_rows(doc: dict[str, Any]) -> list[list[str]]:
    """What the guide talks about, per pool: short streams, how many decoded beside a long prefill on
    their own instance (in the pool, for P/D), their stalls and worst gap, ITL P99.9."""
    rows = []
    for pool, s in doc["pools"].items():
        f = s.get("pdfleet", {}).get("short_streams")
        if "error" in s or not f:
            continue
        short = s["pdfleet"]["classes"].get("short", {})
        same = fmt(f["overlapped_same_instance"])
        overlapped = same if pool == "colocated" else f"{same} (in pool: {f['overlapped_in_pool']})"
        rows.append(
            [
                pool,
                fmt(f["streams"]),
                overlapped,
                fmt(f["stalls_per_100_streams"]),
                fmt(f["overlapped_stalls"] if pool == "colocated" else f["in_pool_stalls"]),
                fmt(f["worst_gap_ms"], 0),
                fmt(short.get("p99.9_itl_ms")),
            ]
        )
    return rows


def short_notes(doc: dict[str, Any]) -> list[str]:
    """How each pool's instance was known, and a confidence note where the overlaps are few."""
    out = []
    for pool, s in doc["pools"].items():
        f = s.get("pdfleet", {}).get("short_streams")
        if "error" in s or not f:
            continue
        out.append(f"{pool}: {f['attribution']}; {f['long_prefills']} long prefills in the run")
        warn = confidence_note(pool, f)
        if warn:
            out.append(f"LOW CONFIDENCE: {warn}")
    return out


def interference_note(doc: dict[str, Any]) -> str | None:
    """What the long prompts did to the short streams: colocated against P/D stalls and ITL P99.9, with
    the same-instance overlaps behind them."""
    pools = doc["pools"]
    if (
        "colocated" not in pools
        or "disagg" not in pools
        or any("error" in pools[p] for p in ("colocated", "disagg"))
    ):
        return None
    c, d = pools["colocated"]["pdfleet"]["classes"], pools["disagg"]["pdfleet"]["classes"]
    if "short" not in c or "short" not in d:
        return None
    ci, di = c["short"]["p99.9_itl_ms"], d["short"]["p99.9_itl_ms"]
    cs, ds = c["short"]["stalls_per_100_streams"], d["short"]["stalls_per_100_streams"]
    if not all(isinstance(v, int | float) for v in (ci, di, cs, ds)):
        return None
    f = pools["colocated"]["pdfleet"].get("short_streams") or {}
    n = f.get("overlapped_same_instance")
    behind = (
        f" ({n} short streams overlapped a long prefill on their own colocated instance)"
        if isinstance(n, int)
        else ""
    )
    if ci > di and cs > ds:
        return (
            f"Long-prompt interference shows on the colocated pool{behind}: short streams' stalls per 100 "
            f"streams {cs:.1f} vs {ds:.1f} on P/D, ITL P99.9 {ci:.0f} ms vs {di:.0f} ms."
        )
    return (
        f"No long-prompt interference on the colocated pool at this load{behind}: short streams' stalls "
        f"per 100 streams {cs:.1f} vs {ds:.1f} on P/D, ITL P99.9 {ci:.0f} ms vs {di:.0f} ms."
    )


def error_lines(doc: dict[str, Any]) -> list[str]:
    """Every pool that was down and every distinct request error, with its count."""
    out = []
    for pool, s in doc["pools"].items():
        if "error" in s:
            out.append(f"{pool}: {s['error']}")
            continue
        for err, n in s["pdfleet"]["errors"].items():
            out.append(f"{pool}: {n} request(s) failed: {err}")
        if s["pdfleet"]["cancelled"]:
            out.append(f"{pool}: {s['pdfleet']['cancelled']} request(s) cancelled (not counted as failed)")
    return out


def verdict_lines(v: Verdict) -> list[str]:
    """The verdict, the numbers that decided it, advice and warnings."""
    out = [f"**{v.headline}**", ""]
    out += [f"- {k}: {fmt(val)}" for k, val in v.deciding.items()]
    out += ["", *[f"- advice: {a}" for a in v.advice], *[f"- WARNING: {w}" for w in v.warnings]]
    return out


def markdown(doc: dict[str, Any], verdict: Verdict, plots: Sequence[Path]) -> str:
    """report.md's text (plots linked by file name)."""
    title = f"# pdfleet bench: {doc['profile']}, workload {doc['workload']['name']}, seed {doc['seed']}"
    lines = [title + (" (PARTIAL: interrupted)" if doc["partial"] else ""), ""]
    if doc["time_scale"] != 1:
        lines += [f"Times are simulated seconds (client wall times / time scale {doc['time_scale']:g}).", ""]
    lines += ["## Short streams beside long prefills", ""]
    note = interference_note(doc)
    lines += [note, ""] if note else []
    lines += [*markdown_table(SHORT, short_rows(doc)), "", *[f"- {n}" for n in short_notes(doc)], ""]
    if doc.get("colocated_choices"):
        lines += ["## Colocated balancing", "", *markdown_table(CHOICES, choice_rows(doc)), ""]
        lines += [*[f"- {n}" for n in choice_notes(doc)], ""]
    lines += ["## Headline", "", *markdown_table(HEADLINE, headline_rows(doc)), ""]
    lines += ["## Verdict", "", *verdict_lines(verdict), ""]
    lines += ["## Fair comparison (per GPU)", "", *markdown_table(FAIR, fair_rows(doc)), ""]
    lines += [
        "## Server side (run window, via the metrics source)",
        "",
        *markdown_table(SERVER, server_rows(doc)),
    ]
    lines += ["", *[f"- {n}" for n in server_notes(doc)], f"- {bucket_note(doc)}", ""]
    lines += [
        "## Decider reasons",
        "",
        *markdown_table(REASONS, reason_rows(doc)),
        "",
        f"- {REASONS_NOTE}",
        "",
    ]
    lines += routes.markdown_section(doc, markdown_table)
    lines += ["## Client", "", *[f"- {n}" for n in client_notes(doc)], ""]
    errs = error_lines(doc)
    lines += ["## Errors", "", *([f"- {e}" for e in errs] or ["- none"]), ""]
    lines += ["## Plots", "", *[f"![{p.stem}]({p.name})" for p in plots], ""]
    return "\n".join(lines)


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An escaped HTML table."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(doc: dict[str, Any], verdict: Verdict, plots: Sequence[Path]) -> str:
    """report.html: the same content, one file, plots inlined."""
    esc = html.escape
    title = f"pdfleet bench: {doc['profile']}, workload {doc['workload']['name']}, seed {doc['seed']}"
    parts = [f"<h1>{esc(title)}{' (PARTIAL: interrupted)' if doc['partial'] else ''}</h1>"]
    parts += ["<h2>Short streams beside long prefills</h2>"]
    note = interference_note(doc)
    parts += [f"<p>{esc(note)}</p>"] if note else []
    parts += [html_table(SHORT, short_rows(doc))]
    parts += ["<ul>", *[f"<li>{esc(n)}</li>" for n in short_notes(doc)], "</ul>"]
    if doc.get("colocated_choices"):
        parts += ["<h2>Colocated balancing</h2>", html_table(CHOICES, choice_rows(doc))]
        parts += ["<ul>", *[f"<li>{esc(n)}</li>" for n in choice_notes(doc)], "</ul>"]
    parts += ["<h2>Headline</h2>", html_table(HEADLINE, headline_rows(doc))]
    parts += ["<h2>Verdict</h2>", f"<p><b>{esc(verdict.headline)}</b></p><ul>"]
    parts += [f"<li>{esc(k)}: {esc(fmt(v))}</li>" for k, v in verdict.deciding.items()]
    parts += [f"<li>advice: {esc(a)}</li>" for a in verdict.advice]
    parts += [f"<li><b>WARNING</b>: {esc(w)}</li>" for w in verdict.warnings] + ["</ul>"]
    parts += ["<h2>Fair comparison (per GPU)</h2>", html_table(FAIR, fair_rows(doc))]
    parts += ["<h2>Server side</h2>", html_table(SERVER, server_rows(doc))]
    parts += ["<ul>", *[f"<li>{esc(n)}</li>" for n in [*server_notes(doc), bucket_note(doc)]], "</ul>"]
    parts += [
        "<h2>Decider reasons</h2>",
        html_table(REASONS, reason_rows(doc)),
        f"<p>{esc(REASONS_NOTE)}</p>",
    ]
    parts += routes.html_section(doc, html_table)
    parts += ["<h2>Client</h2><ul>", *[f"<li>{esc(n)}</li>" for n in client_notes(doc)], "</ul>"]
    parts += ["<h2>Errors</h2><ul>", *[f"<li>{esc(e)}</li>" for e in error_lines(doc) or ["none"]], "</ul>"]
    parts += ["<h2>Plots</h2>"]
    parts += [img_tag(p) for p in plots]
    return html_document(title, parts)


def img_tag(png: Path) -> str:
    """A PNG inlined as a base64 <img> (the report stays one file)."""
    data = base64.b64encode(png.read_bytes()).decode()
    return f'<p><img alt="{html.escape(png.stem)}" src="data:image/png;base64,{data}"></p>'


def html_document(title: str, parts: Sequence[str]) -> str:
    """A self-contained HTML page (the reports' style) around the parts."""
    style = (
        "body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n"
    )


def write_report(out_dir: Path, doc: dict[str, Any], verdict: Verdict, plots: Sequence[Path]) -> None:
    """report.md and report.html in out_dir."""
    (out_dir / "report.md").write_text(markdown(doc, verdict, plots), encoding="utf-8")
    (out_dir / "report.html").write_text(html_page(doc, verdict, plots), encoding="utf-8")


def write_all(
    out_dir: Path, result: Any, model: str, profile: str, thresholds: Any
) -> tuple[dict[str, Any], Verdict]:
    """Every output of a bench into out_dir: results, per-request lines, plots, report.md and report.html."""
    from pdfleet.bench.plots import all_plots  # matplotlib only when writing a report
    from pdfleet.bench.results import write_results

    doc, verdict = write_results(out_dir, result, model, profile, thresholds)
    plots = all_plots(result, doc["pools"], out_dir)
    write_report(out_dir, doc, verdict, plots)
    return doc, verdict
