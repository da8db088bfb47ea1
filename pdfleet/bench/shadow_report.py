"""The bench's report and verdict from live traffic (issue 33 `invoke shadow.report`): the shadow series.

Each shadowed request has two sides in the gateway's `pdfleet_gateway_shadow_*` series: `shadow="false"`,
the client's own request on the colocated pool, and `shadow="true"`, its copy on the P/D pool, at the
same time. Per class and effective-length bin this reads, for both sides over a window: requests and
errors, TTFT P95/P99, stream-gap (ITL) P99 and stalls per 100 streams; beside them the colocated pool's
streams that decoded or stalled while their own instance prefilled a long prompt (what moving long
prompts would remove). The verdict is the bench's rule (pdfleet.bench.verdict) on: each side's TTFT
P95, and from vLLM's own series TPOT P95 and queue P95 of each pool and the KV transfer P95 of the P/D
pool (those cover each pool's whole traffic in the window, not only the shadowed requests: said in the
report). A figure the source cannot give is None (shown as n/a), never a zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdfleet.bench.server_side import chain, value_of
from pdfleet.bench.verdict import PoolFigures, Thresholds, Verdict, decide
from pdfleet.metrics.source import MetricsError, MetricsSource

PREFIX = "pdfleet_gateway_shadow_"
SIDES = (("primary", "false"), ("shadow", "true"))
BY = ("length_class", "length_bin", "shadow")
TPOT = "vllm:request_time_per_output_token_seconds"
BIN_ORDER = ("0-2k", "2k-8k", "8k-16k", "16k-32k", "32k+")
COLUMNS = ("class", "bin", "side", "requests", "errors", "TTFT P95", "TTFT P99", "ITL P99", "stalls/100")


@dataclass
class ShadowReport:
    """What shadow.report prints: rows per class, bin and side, the long-prefill counts, the verdict."""

    window_s: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    long_prefill: dict[str, dict[str, float]] = field(default_factory=dict)
    figures: dict[str, PoolFigures] = field(default_factory=dict)
    verdict: Verdict | None = None
    notes: list[str] = field(default_factory=list)


def _read(fn: Any, *args: Any, **kwargs: Any) -> dict[tuple[str, ...], float]:
    """A source's answer, or {} when it has no such series (the caller shows n/a)."""
    try:
        got = fn(*args, **kwargs)
    except MetricsError:
        return {}
    return {k: v for k, v in got.items() if isinstance(v, float | int) and math.isfinite(v)}


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def _match(model: str | None, **more: str) -> dict[str, str] | None:
    found = {**({"model": model} if model else {}), **more}
    return found or None


def shadow_rows(source: MetricsSource, window_s: float, model: str | None = None) -> list[dict[str, Any]]:
    """Per class, bin and side: requests, errors, TTFT P95/P99 (ms), ITL P99 (ms), stalls per 100."""
    match = _match(model)
    counts = _read(source.increase, PREFIX + "requests_total", window_s, by=(*BY, "outcome"), match=match)
    ttft = {
        q: _read(source.quantile, q, PREFIX + "ttft_seconds", window_s, by=BY, match=match)
        for q in (0.95, 0.99)
    }
    itl = _read(source.quantile, 0.99, PREFIX + "chunk_gap_seconds", window_s, by=BY, match=match)
    stalls = _read(source.increase, PREFIX + "stream_stalls_total", window_s, by=BY, match=match)
    groups: dict[tuple[str, str, str], dict[str, float]] = {}
    for (cls, b, side, outcome), n in counts.items():
        per = groups.setdefault((cls, b, side), {})
        per[outcome] = per.get(outcome, 0.0) + n
    rows: list[dict[str, Any]] = []
    for (cls, b, side), per in groups.items():
        requests = sum(per.values())
        key = (cls, b, side)
        rows.append(
            {
                "class": cls,
                "bin": b,
                "side": "shadow" if side == "true" else "primary",
                "requests": requests,
                "errors": per.get("error", 0.0),
                "ttft_p95_ms": _ms(ttft[0.95].get(key)),
                "ttft_p99_ms": _ms(ttft[0.99].get(key)),
                "itl_p99_ms": _ms(itl.get(key)),
                "stalls_per_100": 100 * stalls.get(key, 0.0) / requests if requests else None,
            }
        )
    order = {b: i for i, b in enumerate(BIN_ORDER)}
    rows.sort(key=lambda r: (r["class"], order.get(r["bin"], 99), r["side"] != "primary"))
    return rows


def _side_ttft(source: MetricsSource, window_s: float, model: str | None, side: str) -> float | None:
    got = _read(source.quantile, 0.95, PREFIX + "ttft_seconds", window_s, match=_match(model, shadow=side))
    return _ms(got.get(()))


def _tpot(source: MetricsSource, window_s: float, model: str | None, **where: str) -> float | None:
    got = _read(source.quantile, 0.95, TPOT, window_s, match=_match(model, **where))
    return _ms(got.get(()))


def pool_figures(
    source: MetricsSource,
    window_s: float,
    model: str | None = None,
    vllm_model: str | None = None,
    kv_histogram: str | None = None,
) -> dict[str, PoolFigures]:
    """The verdict's inputs: each side's TTFT P95 (the shadowed requests), each pool's TPOT and queue
    P95 and the P/D pool's KV transfer P95 from `kv_histogram`, its connector's (vLLM's series: the pool's
    whole traffic)."""
    colo = chain(source, "colocated", window_s, None)
    pd = chain(source, "disagg", window_s, kv_histogram)
    colo_queue = value_of(colo.get("queue_p95_ms", {}))
    return {
        "colocated": PoolFigures(
            ttft_p95_ms=_side_ttft(source, window_s, model, "false"),
            tpot_p95_ms=_tpot(source, window_s, vllm_model, pool="colocated"),
            prefill_queue_p95_ms=colo_queue,
            decode_queue_p95_ms=colo_queue,
        ),
        "disagg": PoolFigures(
            ttft_p95_ms=_side_ttft(source, window_s, model, "true"),
            tpot_p95_ms=_tpot(source, window_s, vllm_model, pool="disagg", role="decode"),
            prefill_queue_p95_ms=value_of(pd.get("queue_p95_ms", {}), "prefill"),
            decode_queue_p95_ms=value_of(pd.get("queue_p95_ms", {}), "decode"),
            kv_transfer_p95_ms=value_of(pd.get("kv_transfer_p95_ms", {})),
        ),
    }


def long_prefill_counts(
    source: MetricsSource, window_s: float, model: str | None = None
) -> dict[str, dict[str, float]]:
    """Per length class: colocated streams that overlapped a long prefill on their instance, and stalls."""
    out: dict[str, dict[str, float]] = {}
    for key, name in (("overlaps", "long_prefill_overlaps_total"), ("stalls", "long_prefill_stalls_total")):
        got = _read(
            source.increase, "pdfleet_gateway_" + name, window_s, by=("length_class",), match=_match(model)
        )
        for (cls,), n in got.items():
            out.setdefault(cls, {"overlaps": 0.0, "stalls": 0.0})[key] = n
    return out


def build_report(
    source: MetricsSource,
    window_s: float,
    thresholds: Thresholds,
    model: str | None = None,
    vllm_model: str | None = None,
    kv_histogram: str | None = None,
) -> ShadowReport:
    """The whole report over the last `window_s` seconds (`model`: the gateway's label, `vllm_model`:
    vLLM's; None: every model's series summed; `kv_histogram`: the P/D model's KV-transfer histogram)."""
    report = ShadowReport(window_s)
    report.rows = shadow_rows(source, window_s, model)
    report.long_prefill = long_prefill_counts(source, window_s, model)
    report.figures = pool_figures(source, window_s, model, vllm_model, kv_histogram)
    if not report.rows:
        report.notes.append(
            "no shadowed request in the window: start one (invoke shadow --stage S --share N) or widen "
            "--minutes"
        )
    report.verdict = decide(report.figures["colocated"], report.figures["disagg"], thresholds)
    report.notes.append(
        "TTFT P95 of each side is the shadowed requests'; TPOT, queue and KV-transfer P95 are vLLM's "
        "figures of each pool's whole traffic in the window"
    )
    return report


def _cell(v: Any, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and v.is_integer() and digits == 0:
        return str(int(v))
    return f"{v:.{digits}f}"


def table_rows(report: ShadowReport) -> list[tuple[str, ...]]:
    """The report's rows as printed cells, in COLUMNS' order."""
    return [
        (
            r["class"],
            r["bin"],
            r["side"],
            _cell(r["requests"]),
            _cell(r["errors"]),
            _cell(r["ttft_p95_ms"]),
            _cell(r["ttft_p99_ms"]),
            _cell(r["itl_p99_ms"], 1),
            _cell(r["stalls_per_100"], 1),
        )
        for r in report.rows
    ]


def as_dict(report: ShadowReport) -> dict[str, Any]:
    """The report as JSON-ready data (shadow.report --json)."""
    verdict = report.verdict
    figures: Mapping[str, PoolFigures] = report.figures
    return {
        "window_s": report.window_s,
        "rows": report.rows,
        "long_prefill": report.long_prefill,
        "figures": {k: vars(v) for k, v in figures.items()},
        "verdict": None
        if verdict is None
        else {
            "decision": verdict.decision,
            "headline": verdict.headline,
            "deciding": verdict.deciding,
            "advice": verdict.advice,
            "warnings": verdict.warnings,
        },
        "notes": report.notes,
    }
