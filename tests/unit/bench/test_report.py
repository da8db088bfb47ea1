"""Markdown tables and notes; `invoke bench`'s report.md and report.html: headline per pool and class, the
interference sentence, the verdict with its numbers, per-GPU table, server figures (and why one is
missing), the client's lateness, every error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pdfleet.bench.report import (
    headline_rows,
    html_page,
    interference_note,
    markdown,
    markdown_table,
    note,
    short_rows,
)
from pdfleet.bench.results import write_results
from pdfleet.bench.verdict import Thresholds
from tests.unit.bench.helpers import built_result


def _doc(tmp_path: Path, partial: bool = False):  # noqa: ANN202
    return write_results(
        tmp_path, built_result(partial), "llama", "lab-cross", Thresholds(1000, 100, 500, 500)
    )


def test_markdown_has_every_section_and_says_where_the_interference_is(tmp_path: Path) -> None:
    doc, verdict = _doc(tmp_path)
    text = markdown(doc, verdict, [tmp_path / "ttft_cdf.png"])
    for section in (
        "## Headline",
        "## Verdict",
        "## Fair comparison (per GPU)",
        "## Server side",
        "## Decider reasons",
        "## Client",
        "## Errors",
        "![ttft_cdf](ttft_cdf.png)",
    ):
        assert section in text
    assert "Long-prompt interference shows on the colocated pool" in text
    assert "colocated: 1 request(s) failed: the connection closed mid-stream" in text
    assert "n/a: no observation" in text and "'<300'" in text
    assert "| prefix-cache hits |" in text and "| 38% |" in text  # 37.5% of the prompt tokens looked up
    assert verdict.headline in text and "schedule lateness P99 0.50 ms" in text
    assert "| colocated | forced_header 100% of 5 requests |" in text  # the run's pool header
    assert "| disagg | n/a: no series pdfleet_gateway_decisions_total in the window |" in text
    rows = {(r[0], r[1]): r for r in headline_rows(doc)}
    assert (
        rows[("colocated", "short")][7] == "80.0" and rows[("disagg", "short")][7] == "0.0"
    )  # 4 stalls, 5 streams
    assert rows[("colocated", "all")][3] == "1"


def test_the_report_leads_with_short_streams_and_the_overlaps_behind_them(tmp_path: Path) -> None:
    """Two of colocated's four short streams decoded through the long prefill on its instance (round
    robin: the long prompt went second to last); P/D's decode beside no prefill."""
    doc, verdict = _doc(tmp_path)
    text = markdown(doc, verdict, [])
    assert text.index("## Short streams beside long prefills") < text.index("## Headline")
    rows = {r[0]: r for r in short_rows(doc)}
    assert rows["colocated"][1:5] == ["5", "2", "80.0", "2"]  # 4 stalls in 5 streams, 2 in the overlapped
    assert rows["disagg"][2] == "0 (in pool: 4)" and rows["disagg"][3] == "0.0"
    assert "(2 short streams overlapped a long prefill on their own colocated instance)" in text
    assert "LOW CONFIDENCE: only 2 short stream(s) on the colocated pool" in text
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {(r["pool"], r["index"]): r["instance"] for r in lines}[("colocated", 0)] == 1
    assert all(r["instance"] is None for r in lines if r["pool"] == "disagg")


def test_no_interference_is_said_too(tmp_path: Path) -> None:
    doc, _ = _doc(tmp_path)
    doc["pools"]["disagg"]["pdfleet"]["classes"]["short"]["p99.9_itl_ms"] = 10_000.0
    assert str(interference_note(doc)).startswith("No long-prompt interference")


def test_partial_and_late_client_are_flagged(tmp_path: Path) -> None:
    doc, verdict = _doc(tmp_path, partial=True)
    doc["pools"]["disagg"]["pdfleet"]["client"]["p99_schedule_lateness_ms"] = 9.0
    text = markdown(doc, verdict, [])
    assert "(PARTIAL: interrupted)" in text.splitlines()[0]
    assert "disagg: schedule lateness P99 9.00 ms" in text and "THE CLIENT WAS LATE" in text


def test_html_is_one_self_contained_file(tmp_path: Path) -> None:
    doc, verdict = _doc(tmp_path)
    png = tmp_path / "x.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    page = html_page(doc, verdict, [png])
    assert page.startswith("<!doctype html>") and "data:image/png;base64,iVBORw0KGgpmYWtl" in page
    assert "<script" not in page and 'src="http' not in page and "&lt;300" in page


def test_markdown_table() -> None:
    """Header, separator, one line per row; cells through str()."""
    assert markdown_table(["a", "b c"], [[1, "x"], [2.5, "-"]]) == [
        "| a | b c |",
        "|---|---|",
        "| 1 | x |",
        "| 2.5 | - |",
    ]
    assert markdown_table(["only"], []) == ["| only |", "|---|"]


def test_note_only_when_there_is_something_to_say() -> None:
    """Items joined by '; ' between the lead and the tail, after a blank line; nothing without items."""
    assert note("slow: ", ["a at 1", "b at 2"], ". Rerun.") == ["", "note: slow: a at 1; b at 2. Rerun."]
    assert note("slow: ", [], ". Rerun.") == []


def test_a_mooncake_run_names_the_histogram_its_kv_transfer_came_from(tmp_path: Path) -> None:
    """Issue 25: results.json keeps which KV-transfer histogram the P/D pool was read from (the connector's,
    from the facts table) and the report's bucket note gives that histogram's first bucket; a run that
    read none (0.11.0's NIXL, colocated) adds no KV note."""
    result = built_result()
    disagg = result.pools["disagg"]
    disagg.target = dataclasses.replace(disagg.target, kv_histogram="vllm:mooncake_xfer_time_seconds")
    disagg.server["kv_transfer_p95_ms"] = {"prefill": 3.0}  # Mooncake observes on P
    doc, verdict = write_results(
        tmp_path, result, "llama", "lab-cross-mooncake", Thresholds(1000, 100, 500, 500)
    )
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["pools"]["disagg"]["pdfleet"]["kv_transfer_histogram"] == "vllm:mooncake_xfer_time_seconds"
    assert saved["pools"]["colocated"]["pdfleet"]["kv_transfer_histogram"] is None
    text = markdown(doc, verdict, [])
    assert "KV transfer's (vllm:mooncake_xfer_time_seconds) first bucket ends at 5 ms" in text
    assert "| disagg | prefill | 350 | n/a | <5 | n/a |" in text  # inside that histogram's first bucket
    plain, _ = _doc(tmp_path / "nixl-less")
    assert "KV transfer's" not in markdown(plain, verdict, [])
