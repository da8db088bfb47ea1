"""A routed run's figures per route (the gateway's pool and decider reason headers) and length class, and
the report's section: what the gateway routed by, and whether the bench set the stage."""

from __future__ import annotations

from pdfleet.bench.client import Record
from pdfleet.bench.report import markdown_table
from pdfleet.bench.routes import markdown_section, reason_counts, route_figures, route_of, routing_notes
from pdfleet.bench.stats import Bounds


def _rec(cls: str, served: str, decision: str, ttft: float, error: str = "") -> Record:
    start = 1.0
    chunks = [] if error else [start + ttft + 0.01 * i for i in range(5)]
    return Record(
        length_class=cls,
        served=served,
        decision=decision,
        start=start,
        end=chunks[-1] if chunks else start,
        ttft=ttft if chunks else float("nan"),
        chunks=chunks,
        output_tokens=len(chunks),
        status=200 if chunks else 503,
        error=error,
    )


RECORDS = [
    _rec("short", "colocated", "short", 0.05),
    _rec("short", "colocated", "short", 0.07),
    _rec("long", "disagg", "stage_weight", 2.0),
    _rec("long", "colocated", "prefill_busy", 3.0),
    _rec("long", "", "prefill_busy", 0.0, error="HTTP 503"),
]


def test_each_request_is_counted_on_the_route_the_gateway_said() -> None:
    assert [route_of(r) for r in RECORDS] == [
        "colocated/short",
        "colocated/short",
        "disagg/stage_weight",
        "colocated/prefill_busy",
        "none/prefill_busy",
    ]
    cancelled = _rec("short", "", "", 0.1, error="interrupted (Ctrl-C)")
    cancelled.cancelled = True
    assert reason_counts([*RECORDS, cancelled]) == {"short": 2, "stage_weight": 1, "prefill_busy": 2}


def test_route_figures_split_by_class_with_the_benchs_own_figures() -> None:
    figs = route_figures(RECORDS, 10.0, Bounds(3000.0, 60.0))
    assert list(figs) == [
        "colocated/short",
        "colocated/prefill_busy",
        "disagg/stage_weight",
        "none/prefill_busy",
    ]
    short = figs["colocated/short"]
    assert short["requests"] == 2 and list(short["classes"]) == ["short"]
    assert short["classes"]["short"]["failed"] == 0
    assert 50 < short["classes"]["short"]["p95_ttft_ms"] <= 70
    assert figs["disagg/stage_weight"]["classes"]["long"]["p95_ttft_ms"] == 2000
    assert figs["none/prefill_busy"]["classes"]["long"] | {"p95_ttft_ms": 0} == {
        "requests": 1,
        "failed": 1,
        "p95_ttft_ms": 0,
        "median_itl_ms": figs["none/prefill_busy"]["classes"]["long"]["median_itl_ms"],
        "p95_itl_ms": figs["none/prefill_busy"]["classes"]["long"]["p95_itl_ms"],
        "p95_tpot_ms": figs["none/prefill_busy"]["classes"]["long"]["p95_tpot_ms"],
    }


ROUTING = {
    "stage": "long-prompts",
    "stage_percent_disagg": {"short": 0, "long": 100},
    "long_prompt_tokens": 8192,
    "threshold_on": "prompt",
    "version": 7,
}


def test_the_report_section_names_the_routes_and_what_the_gateway_routed_by() -> None:
    doc = {
        "pools": {"routed": {"pdfleet": {"routes": route_figures(RECORDS, 10.0, Bounds(3000.0, 60.0))}}},
        "routing": {**ROUTING, "set_from": "colocated"},
    }
    section = markdown_section(doc, markdown_table)
    assert section[0] == "## Routes taken"
    assert sum(line.startswith("| colocated/short | short | 2 | 0 |") for line in section) == 1
    assert routing_notes(doc) == [
        "gateway stage long-prompts (to P/D: short 0%, long 100%), long_prompt_tokens 8192 on prompt tokens, "
        "policy version 7",
        "the bench set this stage for the run; the gateway was put back to colocated",
    ]
    assert markdown_section({"pools": {"colocated": {"pdfleet": {}}}}, markdown_table) == []
