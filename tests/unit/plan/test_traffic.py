"""The planner's traffic is invoke bench's: the same seeded lengths and arrivals."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.bench.arrivals import gamma_starts
from pdfleet.bench.compare import BenchPlan
from pdfleet.bench.trace import TraceRequest, write_trace
from pdfleet.bench.workloads import WorkloadSpec, build
from pdfleet.errors import ValidationError
from pdfleet.plan.traffic import load_of, prefix_warning, requests_of, requests_of_results, requests_of_trace


def test_requests_are_benchs_items_at_benchs_times() -> None:
    plan = BenchPlan(WorkloadSpec(input_len=512), seed=7, rate=3, duration_s=20)
    reqs = requests_of(plan)
    items = build(plan.workload, plan.request_count(), 7)
    starts = gamma_starts(len(items), 3, 1.0, 7)
    assert [(r.at, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (t, it.prompt_tokens, it.output_tokens) for it, t in zip(items, starts, strict=True)
    ]
    assert all(r.effective_tokens == r.prompt_tokens for r in reqs)


def test_a_bench_runs_results_give_back_the_requests_it_sent() -> None:
    spec = WorkloadSpec(name="long-prompt-mix", input_len=512)
    sent = requests_of(BenchPlan(spec, seed=3, rate=2.0, num_prompts=40, burstiness=1.0))
    pool = {"request_rate": 2.0, "num_prompts": 40, "burstiness": 1.0}
    doc = {"workload": spec.__dict__, "seed": 3, "pools": {"colocated": {"error": "down"}, "disagg": pool}}
    assert requests_of_results(doc) == sent
    assert requests_of_results({**doc, "seed": 4}) != sent


def test_the_load_gives_each_thresholds_share() -> None:
    plan = BenchPlan(WorkloadSpec(input_len=512, long_share=0.5), seed=1, rate=5, duration_s=40)
    load = load_of(requests_of(plan), 60, (4096, 30001))
    share, mean = load.long[4096]
    assert 0.35 < share < 0.65 and 16000 <= mean <= 30000
    assert load.long[30001] == (0.0, 0.0)
    assert 4 < load.rate < 6 and load.tpot_s == 0.06


def test_closed_loop_traffic_is_refused() -> None:
    with pytest.raises(ValidationError, match="open-loop arrivals"):
        requests_of(BenchPlan(WorkloadSpec(), concurrency=4, num_prompts=10))


def test_workloads_with_shared_prefixes_carry_a_warning() -> None:
    assert prefix_warning("long-prompt-mix") is None
    warn = prefix_warning("agentic")
    assert warn is not None and "models no prefix cache" in warn


def test_a_trace_gives_its_own_times_lengths_and_the_captures_effective_tokens(tmp_path: Path) -> None:
    rows = [
        TraceRequest(timestamp=1000, input_length=20000, output_length=50, effective_tokens=3000),
        TraceRequest(timestamp=1500, input_length=400, output_length=0),
        TraceRequest(timestamp=3000, input_length=600, output_length=20),
        TraceRequest(timestamp=9000, input_length=700, output_length=20),
    ]
    path = tmp_path / "t.jsonl"
    write_trace(path, rows)
    reqs, empty = requests_of_trace(path, duration_s=5)
    assert [(r.at, r.prompt_tokens, r.output_tokens, r.effective_tokens) for r in reqs] == [
        (0.0, 20000, 50, 3000),
        (2.0, 600, 20, 600),
    ]
    assert empty == 1
    write_trace(path, rows[1:2])
    with pytest.raises(ValidationError, match="no request with an output token"):
        requests_of_trace(path)
