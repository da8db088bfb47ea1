"""The report's colocated balancing section: per choice run, the short streams' figures with the overlaps
behind them and the long prompts' TTFT, the attribution and confidence notes, each later choice against
the first; results.json's `colocated_choices` and requests.jsonl's `choice`."""

from __future__ import annotations

import json
from pathlib import Path

from pdfleet.bench.balancing import choice_notes, choice_rows
from pdfleet.bench.report import html_page, markdown
from pdfleet.bench.results import write_results
from pdfleet.bench.verdict import Thresholds
from tests.unit.bench.helpers import built_result


def test_the_colocated_choices_are_compared_side_by_side(tmp_path: Path) -> None:
    doc, verdict = write_results(
        tmp_path, built_result(choices=True), "llama", "lab-cross", Thresholds(1000, 100, 500, 500)
    )
    rows = {r[0]: r for r in choice_rows(doc)}
    assert rows["round_robin"][1:8] == ["5", "2", "80.0", "2", "720", "720.0", "1"]
    assert rows["prefix_load"][1:8] == ["5", "4", "0.0", "0", "20", "20.0", "1"]
    assert rows["round_robin"][8] == rows["prefix_load"][8] == "900"  # the long prompt's TTFT P95
    notes = choice_notes(doc)
    assert (
        "prefix_load: instance from the gateway's header (2 instances); 1 long prefills in the run" in notes
    )
    assert "round_robin: round robin over 2 instances, inferred from the send order; 1 long prefills" in (
        " ".join(notes)
    )
    assert any(
        n.startswith("LOW CONFIDENCE: only 4 short stream(s) on the colocated (prefix_load) pool")
        for n in notes
    )
    assert any(
        n.startswith("prefix_load against round_robin: short streams' stalls per 100 streams 0.0 vs 80.0")
        for n in notes
    )
    text = markdown(doc, verdict, [])
    assert text.index("## Short streams beside long prefills") < text.index("## Colocated balancing")
    assert text.index("## Colocated balancing") < text.index("## Headline")
    assert "the headline and verdict show the first, round_robin" in text
    assert "<h2>Colocated balancing</h2>" in html_page(doc, verdict, [])
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert {(r["pool"], r["choice"]) for r in lines} == {
        ("colocated", "round_robin"),
        ("colocated/prefix_load", "prefix_load"),
        ("disagg", None),
    }
    assert {r["instance"] for r in lines if r["pool"] == "colocated/prefix_load" and r["success"]} == {0}
    plain, _ = write_results(tmp_path, built_result(), "llama", "lab-cross", Thresholds(1000, 100, 500, 500))
    assert plain["colocated_choices"] == {} and "Colocated balancing" not in markdown(plain, verdict, [])
