"""results.json, vllm-<pool>.json and requests.jsonl from a hand-built result: vLLM's keys per pool, NaN as
null, classes, per GPU, errors counted, the verdict's inputs, the partial mark."""

from __future__ import annotations

import json
from pathlib import Path

from pdfleet.bench.results import figures_for_verdict, pool_summary, write_results
from pdfleet.bench.verdict import Thresholds
from tests.unit.bench.helpers import built_result

T = Thresholds(1000, 100, 500, 500)


def test_results_json_has_vllm_keys_per_pool_and_pdfleets_extras(tmp_path: Path) -> None:
    doc, verdict = write_results(tmp_path, built_result(), "llama", "lab-cross", T)
    saved = json.loads((tmp_path / "results.json").read_text())
    colo = saved["pools"]["colocated"]
    for key in (
        "mean_ttft_ms",
        "p99_itl_ms",
        "p99.9_itl_ms",
        "request_goodput",
        "max_concurrent_requests",
        "date",
        "backend",
        "model_id",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "num_prompts",
    ):
        assert key in colo, key
    assert colo["completed"] == 5 and colo["failed"] == 1
    assert colo["pdfleet"]["errors"] == {"the connection closed mid-stream after 1 token event(s)": 1}
    assert set(colo["pdfleet"]["classes"]) == {"short", "long"}
    assert colo["pdfleet"]["classes"]["short"]["stalls"] == 4  # each short stream stopped for 700 ms once
    assert saved["pools"]["disagg"]["pdfleet"]["classes"]["short"]["stalls"] == 0
    assert colo["pdfleet"]["per_gpu"]["request_throughput_per_gpu"] == colo["request_throughput"] / 2
    assert colo["max_concurrency"] is None  # NaN/None written as null, never NaN
    assert "NaN" not in (tmp_path / "results.json").read_text()
    assert saved["verdict"]["decision"] == verdict.decision and not saved["partial"]
    flat = json.loads((tmp_path / "vllm-colocated.json").read_text())
    assert "pdfleet" not in flat and flat["p99_ttft_ms"] == colo["p99_ttft_ms"]
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 11 and sum(not x["success"] for x in lines) == 1
    failed = next(x for x in lines if not x["success"])
    assert failed["error"].startswith("the connection closed mid-stream") and failed["ttft"] is None
    assert doc["pools"]["colocated"]["pdfleet"]["gpus"] == 2


def test_partial_runs_are_marked(tmp_path: Path) -> None:
    doc, _ = write_results(tmp_path, built_result(partial=True), "llama", "lab-cross", T)
    assert doc["partial"] and json.loads((tmp_path / "results.json").read_text())["partial"]


def test_the_verdict_reads_queue_and_kv_figures_per_role() -> None:
    result = built_result()
    colo = figures_for_verdict(pool_summary(result, "colocated"), "colocated")
    pd = figures_for_verdict(pool_summary(result, "disagg"), "disagg")
    assert colo is not None and pd is not None
    assert colo.prefill_queue_p95_ms == colo.decode_queue_p95_ms == 350.0  # one queue serves both phases
    assert pd.prefill_queue_p95_ms == 350.0 and pd.decode_queue_p95_ms is None
    assert pd.kv_transfer_p95_ms == 12.0 and colo.kv_transfer_p95_ms is None
