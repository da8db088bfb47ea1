"""`invoke plan`: options, the written report in bench's shape, and bad input as one clear error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from invoke.exceptions import Exit

from pdfleet.bench.trace import TraceRequest, write_trace
from pdfleet.cli.plan import plan
from tests.unit.cli.helpers import REPO, project_context


@pytest.mark.procs  # starts invoke: see tests/unit/conftest.py
def test_plan_is_listed_and_every_option_has_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "--help", "plan"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    options = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("--")]
    assert len(options) >= 16 and any("--gpus" in ln for ln in options)
    for line in options:  # "--gpus=STRING   help": an option without help is its name alone
        parts = line.strip().split("  ", 1)
        assert len(parts) == 2 and parts[1].strip(), f"no help: {line}"


def test_a_plan_writes_json_markdown_html_and_the_pareto_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan"
    plan(project_context(), profile="lab-cross", gpus="2", duration="30", workers="1", out=str(out))
    doc = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    assert doc["profile"] == "lab-cross" and doc["gpus"] == 2 and doc["hardware"]["link"] == "roce-400g"
    assert doc["layouts"] and [r["rank"] for r in doc["layouts"]] == list(range(1, len(doc["layouts"]) + 1))
    assert doc["recommended"] == doc["layouts"][0]["layout"] or doc["verdict"]["decision"] != "split"
    assert {r["kind"] for r in doc["layouts"]} >= {"colocated", "disagg"}
    assert doc["timing"]["layouts"] == len(doc["layouts"])
    # what `invoke rebalance --to-plan` checks and moves toward: the inventory, each pool's shape
    assert doc["inventory"] == "inventory/lab.yml"
    for row in doc["layouts"]:
        pools = {
            p: f"{s['instances']}{p[0].upper()} tp{s['tp']} b{s['budget']}"
            for p, s in row["pools"].items()
            if s
        }
        assert row["layout"].split(" long>=")[0] == " + ".join(
            pools[p] for p in ("prefill", "decode", "colocated") if p in pools
        )
    md = (out / "report.md").read_text(encoding="utf-8")
    for heading in ("## Recommendation", "## Predicted verdict", "## Profile changes", "## Ranked layouts"):
        assert heading in md
    assert "![pareto](pareto.png)" in md
    assert "data:image/png;base64," in (out / "report.html").read_text(encoding="utf-8")
    printed = capsys.readouterr().out
    assert f"recommended: {doc['recommended']}" in printed
    # no fleet measured and no plan.request_path in the profile: the path is 0, and the report says so
    assert doc["request_path"]["modelled"] is False and doc["request_path"]["colocated_ms"] == []
    assert "- request path: not modelled (0 ms): no measurement" in md
    assert "request path: not modelled (0 ms)" in printed


def test_a_trace_is_planned_at_its_own_times_with_the_profiles_request_path(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "lab-path.yml").write_text(
        "extends: lab-cross\nplan:\n  request_path:\n    colocated_ms: 7.5\n    disagg_ms: 9\n"
        "    source: plan --measure-path on lab-cross, 2026-12-03\n"
    )

    trace = tmp_path / "capture.jsonl"
    rows = [
        TraceRequest(timestamp=i * 250, input_length=300 + 9000 * (i % 8 == 0), output_length=16)
        for i in range(80)
    ]
    write_trace(trace, rows)
    out = tmp_path / "plan"
    ctx = project_context(profiles_dir=str(profiles))
    plan(ctx, profile="lab-path", gpus="2", trace=str(trace), workers="1", out=str(out))
    doc = json.loads((out / "plan.json").read_text(encoding="utf-8"))
    assert doc["workload"] == {"name": "trace", "dataset": str(trace), "seed": None}
    assert doc["requests"] == 80 and abs(doc["duration_s"] - 19.75) < 1e-9
    assert any("models no prefix cache" in w for w in doc["warnings"])
    path = doc["request_path"]
    assert path["modelled"] and (path["colocated_ms"], path["disagg_ms"]) == ([7.5], [9.0])
    assert (
        path["source"] == "profile lab-path's plan.request_path: plan --measure-path on lab-cross, 2026-12-03"
    )
    assert "request path: colocated mean 7.5 ms, P/D mean 9.0 ms, added" in (out / "report.md").read_text(
        encoding="utf-8"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "error: --gpus N is required"),
        ({"gpus": "1"}, "error: --gpus 1: must be between 2 and 64"),
        ({"gpus": "four"}, "error: --gpus 'four': not a whole number"),
        (
            {"gpus": "2", "slo": "ttft=5"},
            "error: --slo 'ttft=5': expected KEY=VALUE with KEY one of ttft_p99_ms",
        ),
        ({"gpus": "2", "slo": "ttft_p99_ms=-1"}, "error: --slo ttft_p99_ms=-1:"),
        ({"gpus": "2", "workload": "nope"}, "error: --workload 'nope': not a workload"),
        (
            {"gpus": "2", "workload": "random", "trace": "t.jsonl"},
            "error: give --workload W or --trace FILE, not both",
        ),
        (
            {"gpus": "2", "trace": "no/such.jsonl"},
            "error: --trace no/such.jsonl: cannot read the file (not found)",
        ),
        (
            {"gpus": "2", "trace": "t.jsonl", "validate": True},
            "error: --validate benches a workload: it does not replay a --trace",
        ),
        ({"gpus": "2", "validate_duration": "30"}, "error: --validate-duration is for --validate"),
        (
            {"gpus": "2", "validate": True, "validate_duration": "3"},
            "error: --validate-duration 3: must be between 5 and 600 s",
        ),
        (
            {"gpus": "2", "validate": True, "validate_duration": "soon"},
            "error: --validate-duration 'soon': not a number of seconds",
        ),
    ],
)
def test_bad_options_are_one_clear_error_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kwargs: dict[str, Any], message: str
) -> None:
    out = tmp_path / "plan"
    with pytest.raises(Exit):
        plan(project_context(), profile="lab-cross", out=str(out), duration="10", workers="1", **kwargs)
    assert message in capsys.readouterr().err
    assert not out.exists()
