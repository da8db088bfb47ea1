"""Every plot is written as a PNG from a hand-built result (files only, no display)."""

from __future__ import annotations

from pathlib import Path

from pdfleet.bench.plots import all_plots
from pdfleet.bench.results import write_results
from pdfleet.bench.verdict import Thresholds
from tests.unit.bench.helpers import built_result


def test_all_plots_are_pngs(tmp_path: Path) -> None:
    result = built_result()
    doc, _ = write_results(tmp_path, result, "llama", "lab-cross", Thresholds(1000, 100, 500, 500))
    paths = all_plots(result, doc["pools"], tmp_path)
    assert [p.name for p in paths] == [
        "ttft_cdf.png",
        "itl_cdf.png",
        "itl_timeline.png",
        "class_bars.png",
        "server_chain.png",
    ]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 2000
