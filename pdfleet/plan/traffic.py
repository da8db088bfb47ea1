"""The traffic a plan predicts: exactly the requests and arrival times `invoke bench` would send for the
same workload, rate, duration and seed (bench's own `BenchPlan`, `workloads.build` and schedule), or a
Mooncake trace read with `bench.trace.read_trace` (a gateway capture's `effective_tokens` kept), as
`Request`s, and the averages the search's cuts read (`Load`).

Effective tokens: the planner's engines model no prefix cache, so every prompt is prefilled whole and its
effective tokens are its prompt tokens, except in a capture whose lines carry the gateway's
`effective_tokens`: the threshold then reads those, as the gateway did. Workloads whose prompts share
prefixes (agentic sessions, prefix-repetition, a trace's hash_ids) are predicted that way too, and
`prefix_warning` says so: their TTFTs are over-estimated and the threshold acts on whole prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pdfleet.bench.compare import BenchPlan
from pdfleet.bench.trace import read_trace
from pdfleet.bench.workloads import WorkloadSpec, build
from pdfleet.errors import ValidationError
from pdfleet.plan.predict import Request
from pdfleet.plan.space import THRESHOLDS, Load

SHARED_PREFIXES = ("agentic", "prefix-repetition", "trace")


def requests_of(plan: BenchPlan) -> list[Request]:
    """bench's requests for this plan, in arrival order, times in simulated seconds."""
    items = build(plan.workload, plan.request_count(), plan.seed)
    starts = plan.schedule(items).starts
    if starts is None:
        raise ValidationError(
            "a plan needs open-loop arrivals (--rate, or a trace's own times), not --concurrency"
        )
    reqs = [
        Request(t / plan.time_scale, it.prompt_tokens, it.output_tokens, it.prompt_tokens)
        for it, t in zip(items, starts, strict=True)
    ]
    return sorted(reqs, key=lambda r: r.at)


def requests_of_results(doc: Mapping[str, Any]) -> list[Request]:
    """The very requests an `invoke bench` run sent (its results.json: workload, seed, and a pool's rate,
    prompt count and burstiness; every pool gets the same)."""
    pool = next(p for p in doc["pools"].values() if "request_rate" in p)
    plan = BenchPlan(
        WorkloadSpec(**doc["workload"]),
        seed=doc["seed"],
        rate=float(pool["request_rate"]),
        num_prompts=int(pool["num_prompts"]),
        burstiness=float(pool["burstiness"]),
    )
    return requests_of(plan)


def requests_of_trace(path: Path | str, duration_s: float | None = None) -> tuple[list[Request], int]:
    """A trace's requests at their own times (s from the first), up to `duration_s` when given, and how
    many were left out because they produced no output token (a capture's requests that ended first)."""
    rows = read_trace(path)
    t0 = rows[0].timestamp
    out: list[Request] = []
    empty = 0
    for r in rows:
        at = (r.timestamp - t0) / 1000
        if duration_s is not None and at > duration_s:
            break
        if r.output_length < 1:
            empty += 1
            continue
        eff = r.effective_tokens if r.effective_tokens is not None else r.input_length
        out.append(Request(at, r.input_length, r.output_length, eff))
    if not out:
        raise ValidationError(f"--trace {path}: no request with an output token in the window")
    return out, empty


def load_of(requests: Sequence[Request], tpot_ms: float, thresholds: Sequence[int] = THRESHOLDS) -> Load:
    """The averages the cuts need (rate over the arrivals' span; per threshold the share going P/D)."""
    n = len(requests)
    span = max(requests[-1].at - requests[0].at, 1e-9) if n > 1 else 1.0
    long: dict[int, tuple[float, float]] = {}
    for thr in thresholds:
        over = [r.prompt_tokens for r in requests if r.effective_tokens >= thr]
        long[thr] = (len(over) / n, sum(over) / len(over) if over else 0.0)
    return Load(
        rate=n / span,
        prompt_mean=sum(r.prompt_tokens for r in requests) / n,
        output_mean=sum(r.output_tokens for r in requests) / n,
        long=long,
        tpot_s=tpot_ms / 1000,
    )


def prefix_warning(workload: str) -> str | None:
    """What the prediction leaves out for a workload whose prompts share prefixes."""
    if workload not in SHARED_PREFIXES:
        return None
    return (
        f"workload {workload}: prompts share prefixes, but the planner models no prefix cache (each prompt "
        "is prefilled whole and the threshold reads whole prompts): predicted TTFTs are upper bounds"
    )
