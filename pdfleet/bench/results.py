"""What a bench writes: `results.json` (per pool, `vllm bench serve`'s keys), `vllm-<pool>.json` (one flat
file per pool, exactly the shape `vllm bench serve --save-result` writes) and `requests.jsonl` (one
line per request: its pool, class, lengths, times and error).

Times in these files are the profile's seconds (wall seconds divided by the simulator's time scale).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from pdfleet.bench.compare import ROUTED, BenchResult, PoolResult, best_rate
from pdfleet.bench.overlap import instances_of, short_streams
from pdfleet.bench.routes import reason_counts, route_figures
from pdfleet.bench.server_side import value_of
from pdfleet.bench.stats import PERCENTILES, gaps, output_len, per_gpu, quantile, summarize, tpot
from pdfleet.bench.verdict import PoolFigures, Thresholds, Verdict, decide

CLASSES = ("short", "long")


def _clean(value: Any) -> Any:
    """NaN and infinities become null: JSON has no NaN, and vLLM's readers expect a number or null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def setup_keys(result: BenchResult, model: str) -> dict[str, Any]:
    """vLLM's setup keys of a saved result."""
    plan = result.plan
    return {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai",
        "backend": "openai",
        "label": "pdfleet",
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": len(result.items),
        "request_rate": "inf" if plan.rate is None else plan.rate,
        "burstiness": plan.burstiness,
        "max_concurrency": plan.concurrency,
    }


def lateness(res: PoolResult) -> dict[str, float]:
    """How late the client was: schedule lateness and event-loop lag, P50/P99/max in wall ms."""
    run = res.run
    assert run is not None
    out: dict[str, float] = {}
    for name, xs in (("schedule_lateness", run.lateness), ("loop_lag", run.loop_lag)):
        s = sorted(xs)
        out[f"p50_{name}_ms"] = 1000 * quantile(s, 0.5)
        out[f"p99_{name}_ms"] = 1000 * quantile(s, 0.99)
        out[f"max_{name}_ms"] = 1000 * s[-1] if s else math.nan
    return out


def pool_summary(result: BenchResult, name: str, run: PoolResult | None = None) -> dict[str, Any]:
    """One pool's figures: vLLM's keys at the top, pdfleet's (classes, per GPU, server) under `pdfleet`;
    `run`: another run of that pool (a colocated choice's) instead of the pool's result."""
    res = run if run is not None else result.pools[name]
    plan = result.plan
    base: dict[str, Any] = {"pool": name, "gpus": res.target.gpus}
    if res.run is None:
        return {**base, "error": res.error}
    recs = res.run.records
    overall = summarize(recs, res.run.wall_s, plan.bounds, plan.time_scale)
    classes = {
        c: summarize([r for r in recs if r.length_class == c], res.run.wall_s, plan.bounds, plan.time_scale)
        for c in CLASSES
    }
    errors: dict[str, int] = {}
    for r in recs:
        if r.error and not r.cancelled:
            errors[r.error] = errors.get(r.error, 0) + 1
    extra = {
        "gpus": res.target.gpus,
        "per_gpu": per_gpu(overall, res.target.gpus),
        "classes": {c: classes[c] for c in CLASSES if classes[c]["completed"] or classes[c]["failed"]},
        "requests_by_class": {c: sum(r.length_class == c for r in recs) for c in CLASSES},
        "cancelled": sum(r.cancelled for r in recs),
        "errors": errors,
        "client": lateness(res),
        "short_streams": short_streams(
            recs, name == "colocated", res.target.instance_count, plan.bounds.stall_ms, plan.time_scale
        ),
        "server": res.server,
        "kv_transfer_histogram": res.target.kv_histogram,
        "kv_cache_usage_peak": res.kv_peak,
        "decider_reasons": res.reasons,
        "interrupted": res.run.interrupted,
    }
    if name == ROUTED:  # the gateway's own routing: each request's route from its answer's headers
        extra["decider_reasons"] = reason_counts(recs)
        extra["routes"] = route_figures(recs, res.run.wall_s, plan.bounds, plan.time_scale)
    if res.sweep:
        extra["sweep"] = res.sweep
        extra["max_rate_meeting_slo"] = best_rate(res.sweep)
    return {**overall, "pdfleet": extra}


def choice_figures(result: BenchResult) -> dict[str, dict[str, Any]]:
    """--colocated-choice: per choice run, what the guide talks about (short streams' stalls per 100
    streams, worst gap, ITL P99.9, the same-instance overlaps behind them) and the long prompts' TTFT
    P95/P99 (ms, the profile's time), or the run's error."""
    out: dict[str, dict[str, Any]] = {}
    for choice, res in result.choices.items():
        s = pool_summary(result, "colocated", res)
        if "error" in s:
            out[choice] = {"error": s["error"]}
            continue
        classes = s["pdfleet"]["classes"]
        short, long = classes.get("short", {}), classes.get("long", {})
        f = s["pdfleet"]["short_streams"]
        out[choice] = {
            "requests": s["completed"] + s["failed"],
            "failed": s["failed"],
            "short_streams": f["streams"],
            "overlapped_same_instance": f["overlapped_same_instance"],
            "stalls_per_100_streams": f["stalls_per_100_streams"],
            "overlapped_stalls": f["overlapped_stalls"],
            "stalls_during_long_prefill": f["stalls_during_long_prefill"],
            "worst_gap_ms": f["worst_gap_ms"],
            "short_p99.9_itl_ms": short.get("p99.9_itl_ms", math.nan),
            "long_requests": long.get("completed", 0) + long.get("failed", 0),
            "long_p95_ttft_ms": long.get("p95_ttft_ms", math.nan),
            "long_p99_ttft_ms": long.get("p99_ttft_ms", math.nan),
            "long_prefills": f["long_prefills"],
            "attribution": f["attribution"],
        }
    return out


def figures_for_verdict(summary: dict[str, Any], pool: str) -> PoolFigures | None:
    """The numbers the verdict reads from one pool's summary (None: the pool did not run)."""
    if "error" in summary:
        return None
    server = summary["pdfleet"]["server"]

    def queue(role_choice: tuple[str, ...]) -> float | None:
        """The largest queue P95 over these roles."""
        figs = server.get("queue_p95_ms", {})
        vals = [v for r in role_choice if (v := value_of(figs, r)) is not None]
        return max(vals) if vals else None

    is_colo = pool == "colocated"
    return PoolFigures(
        ttft_p95_ms=_num(summary.get("p95_ttft_ms")),
        tpot_p95_ms=_num(summary.get("p95_tpot_ms")),
        prefill_queue_p95_ms=queue(("colocated",) if is_colo else ("prefill",)),
        decode_queue_p95_ms=queue(("colocated",) if is_colo else ("decode",)),
        kv_transfer_p95_ms=value_of(server.get("kv_transfer_p95_ms", {})) if not is_colo else None,
        failed=int(summary.get("failed", 0)),
    )


def _num(v: Any) -> float | None:
    """A finite number, else None."""
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else None


def verdict_of(summaries: dict[str, dict[str, Any]], thresholds: Thresholds) -> Verdict:
    """The verdict over the pools' summaries; undecided without a colocated run."""
    colo = figures_for_verdict(summaries["colocated"], "colocated") if "colocated" in summaries else None
    disagg = figures_for_verdict(summaries["disagg"], "disagg") if "disagg" in summaries else None
    if colo is None:
        return Verdict("undecided", "undecided: the colocated pool was not measured", {}, [], [])
    return decide(colo, disagg, thresholds)


def request_lines(result: BenchResult) -> list[dict[str, Any]]:
    """One JSON object per request of every pool (times in the profile's seconds)."""
    s = result.plan.time_scale
    out = []
    runs: list[tuple[str, str | None, PoolResult]] = [(name, None, res) for name, res in result.pools.items()]
    for k, (asked, run) in enumerate(result.choices.items()):
        if k == 0:  # the colocated pool's own run: its lines say which choice it was
            runs = [(n, asked if n == "colocated" else None, r) for n, _, r in runs]
        else:
            runs.append((f"colocated/{asked}", asked, run))
    for name, choice, res in runs:
        if res.run is None:
            continue
        colocated = name.startswith("colocated")
        where = instances_of(res.run.records, res.target.instance_count)[0] if colocated else {}
        for r in res.run.records:
            out.append(
                {
                    "pool": name,
                    "choice": choice,
                    "index": r.index,
                    "instance": where.get(r.index),  # colocated: the gateway's header, else inferred
                    "served": r.served or None,  # the gateway's X-Pdfleet-Pool and X-Pdfleet-Decision
                    "decision": r.decision or None,
                    "length_class": r.length_class,
                    "input_len": r.prompt_tokens,
                    "max_tokens": r.max_tokens,
                    "output_len": output_len(r) if r.success else 0,
                    "start_time": (r.start - res.run.t0) / s if math.isfinite(r.start) else None,
                    "due": r.due / s if math.isfinite(r.due) else None,
                    "ttft": r.ttft / s if r.success else None,
                    "latency": r.latency / s if r.success else None,
                    "tpot": tpot(r, s) if r.success else None,
                    "itl": gaps(r, s),
                    "success": r.success,
                    "error": r.error,
                    "cancelled": r.cancelled,
                }
            )
    return out


def _write(path: Path, text: str) -> None:
    """Write a file atomically (a reader never sees half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_results(
    out_dir: Path, result: BenchResult, model: str, profile: str, thresholds: Thresholds
) -> tuple[dict[str, Any], Verdict]:
    """results.json, vllm-<pool>.json per pool and requests.jsonl in out_dir; the document and verdict."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {name: pool_summary(result, name) for name in result.pools}
    verdict = verdict_of(summaries, thresholds)
    setup = setup_keys(result, model)
    doc = {
        "profile": profile,
        "partial": result.partial,
        "seed": result.plan.seed,
        "workload": result.plan.workload.__dict__,
        "time_scale": result.plan.time_scale,
        "percentiles": list(PERCENTILES),
        "slo_bounds_ms": result.plan.bounds.__dict__,
        "pools": {name: {**setup, **s} for name, s in summaries.items()},
        "colocated_choices": choice_figures(result),
        "routing": result.routing,
        "verdict": verdict.__dict__,
    }
    _write(out_dir / "results.json", json.dumps(_clean(doc), indent=2) + "\n")
    for name, s in summaries.items():
        if "error" not in s:
            flat = {**setup, **{k: v for k, v in s.items() if k != "pdfleet"}}
            _write(out_dir / f"vllm-{name}.json", json.dumps(_clean(flat), indent=2) + "\n")
    lines = (json.dumps(_clean(line)) for line in request_lines(result))
    _write(out_dir / "requests.jsonl", "".join(f"{line}\n" for line in lines))
    return doc, verdict
