"""Is `invoke plan`'s prediction what `invoke bench` measures? Prediction against a bench run, side by side.

Reads an `invoke bench` output directory (results.json: profile, workload, seed, rate, prompts), rebuilds
the very same requests and arrivals, predicts each benched pool as a layout (the profile's pools: the
colocated pool's instances, or the P/D pool's prefill and decode instances taking every request, as the
bench sends them) and prints TTFT and ITL P95 per length class, predicted against measured, with the
error, and the two pools' ranking by the plan's rule on both. The issue's bar: within 15%, same ranking.

The bench run itself goes through the lab (one lab per machine, under its lock):

    flock /work/lab.lock sh -c '.venv/bin/invoke lab.up && .venv/bin/invoke provision --profile lab-cross \\
        && .venv/bin/invoke bench --profile lab-cross --duration 60 --seed 0 --out out/fidelity-cross; \\
        .venv/bin/invoke lab.down'
    .venv/bin/python bench/plan_fidelity.py out/fidelity-cross
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from invoke import Config, Context

from pdfleet.bench.compare import BenchPlan
from pdfleet.bench.fleet_targets import bench_model
from pdfleet.bench.stats import Bounds, gaps
from pdfleet.bench.workloads import WorkloadSpec
from pdfleet.cli.options import open_deployment
from pdfleet.cli.plan import current_of, hardware_of, targets_of
from pdfleet.metrics.source import bucket_quantile
from pdfleet.plan.decide import rank
from pdfleet.plan.predict import Prediction, Request, client_record, run, simulate
from pdfleet.plan.space import Layout
from pdfleet.plan.traffic import requests_of

REPO = Path(__file__).resolve().parents[1]
BAR_PCT = 15.0
FIGURES = (("p95_ttft_ms", "TTFT P95"), ("p95_itl_ms", "ITL P95"))  # the bar
CONTEXT = (("median_itl_ms", "ITL P50"), ("p95_tpot_ms", "TPOT P95"))  # shown beside it, not judged
GAP_MS = 10.0  # vLLM's ITL histogram's first bound: the finest split the instances' own figures allow
BUNCHED_MS = 1.0  # a gap this short is two tokens the client read at once


def _context() -> Context:
    config = Config(project_location=REPO)
    config.load_project()
    return Context(config)


def _layouts(current: Any) -> dict[str, Layout]:
    """The benched pools as layouts: colocated alone; P/D taking every request."""
    out = {}
    if current.pools.get("colocated"):
        out["colocated"] = Layout(colocated=current.pools["colocated"])
    if current.pools.get("prefill") and current.pools.get("decode"):
        out["disagg"] = Layout(None, current.pools["prefill"], current.pools["decode"])
    return out


def _measured(layout: Layout, pool: dict[str, Any]) -> Prediction:
    """A bench pool's figures in the planner's shape, to rank them by the same rule."""
    return Prediction(layout, pool, pool["pdfleet"]["classes"], pool["pdfleet"]["per_gpu"], {}, {})


def _err(pred: float, meas: float) -> float:
    return 100 * (pred - meas) / meas if meas and math.isfinite(meas) and math.isfinite(pred) else math.nan


def _deltas(out_dir: Path) -> dict[tuple[str, str, str], dict[str, float]]:
    """The instances' histograms over the run, summed over hosts: (metric, pool, role) -> {le or "sum" or
    "count": increase}, from the snapshots bench/plan_snapshot.py took before and after it ({} without)."""
    files = [out_dir / f"server-{w}.json" for w in ("before", "after")]
    if not all(f.exists() for f in files):
        return {}
    before, after = (json.loads(f.read_text(encoding="utf-8"))["samples"] for f in files)

    def key(x: dict[str, Any]) -> tuple[str, str, str, str, str]:
        labels = x["labels"]
        name, _, part = x["name"].rpartition("_")
        where = (labels.get("pool", ""), labels.get("role", ""), labels.get("host", ""))
        return name, *where, labels.get("le", part)

    start = {key(x): float(x["value"]) for x in before}
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for x in after:
        name, pool, role, _, part = key(x)
        into = out.setdefault((name, pool, role), {})
        into[part] = into.get(part, 0.0) + float(x["value"]) - start.get(key(x), 0.0)
    return out


def _hist_quantile(h: dict[str, float], q: float) -> float:
    return bucket_quantile(q, [(float(le), c) for le, c in h.items() if le not in ("sum", "count")])


def _gap_shares(records: list[list[float]]) -> tuple[float, float, float]:
    """Pooled gaps (s) of many streams: % over GAP_MS, % under BUNCHED_MS (tokens read at once), mean ms."""
    xs = [g for gs in records for g in gs]
    if not xs:
        return math.nan, math.nan, math.nan
    over = 100 * sum(g > GAP_MS / 1000 for g in xs) / len(xs)
    under = 100 * sum(g < BUNCHED_MS / 1000 for g in xs) / len(xs)
    return over, under, 1000 * sum(xs) / len(xs)


def components(
    out_dir: Path, pool: str, layout: Layout, requests: list[Request], hw: Any, long_tokens: int
) -> list[str]:
    """Where a pool's ITL comes from: the model's gaps, the lab instances' own (simulated time, from their
    histogram), how late their steps' tokens left in wall time, and the client's gaps."""
    records, _ = run(layout, requests, hw)
    pred = _gap_shares([gaps(client_record(r, rec, long_tokens)) for r, _, rec in records])
    lines = [f"{pool:10} gaps over {GAP_MS:g} ms / mean: predicted {pred[0]:.1f}% / {pred[2]:.2f} ms"]
    deltas = _deltas(out_dir)
    roles = sorted({role for (_, p, role) in deltas if p == pool})
    for role in roles:
        itl = deltas.get(("vllm:inter_token_latency_seconds", pool, role), {})
        lag = deltas.get(("pdfleet_sim_step_lag_seconds", pool, role), {})
        if itl.get("count"):
            over = 100 * (1 - itl.get(f"{GAP_MS / 1000:g}", math.nan) / itl["count"])
            mean = 1000 * itl["sum"] / itl["count"]
            lines.append(f"{'':10} lab {role} instances' own gaps (simulated): {over:.1f}% / {mean:.2f} ms")
        if lag.get("count"):
            p50, p95, p99 = (1000 * _hist_quantile(lag, q) for q in (0.5, 0.95, 0.99))
            late = f"P50 {p50:.1f}, P95 {p95:.1f}, P99 {p99:.1f} ms"
            lines.append(f"{'':10} lab {role} steps' tokens late (wall): {late}")
    lines_path = out_dir / "requests.jsonl"
    mine = [json.loads(x) for x in lines_path.read_text(encoding="utf-8").splitlines() if x.strip()]
    client = _gap_shares([x["itl"] for x in mine if x["pool"] == pool and x["success"]])
    lines.append(
        f"{'':10} lab client gaps: {client[0]:.1f}% / {client[2]:.2f} ms; under {BUNCHED_MS:g} ms "
        f"(tokens read together): {client[1]:.1f}%"
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bench_out", help="an invoke bench output directory (its results.json)")
    ap.add_argument("--profile", default=None, help="the profile benched (default: results.json's)")
    ap.add_argument(
        "--inventory", default=None, help="the inventory benched (default: the lab's, as invoke bench)"
    )
    args = ap.parse_args()
    out_dir = Path(args.bench_out)
    doc = json.loads((out_dir / "results.json").read_text(encoding="utf-8"))
    deployment = open_deployment(_context(), args.profile or doc["profile"], args.inventory)
    spec = bench_model(deployment.profile, None)
    slo = spec.slo
    any_pool = next(iter(doc["pools"].values()))
    bench = BenchPlan(
        WorkloadSpec(**doc["workload"]),
        seed=doc["seed"],
        rate=float(any_pool["request_rate"]),
        num_prompts=int(any_pool["num_prompts"]),
        burstiness=float(any_pool["burstiness"]),
    )
    requests = requests_of(bench)
    hw = hardware_of(deployment, None)
    long_tokens = deployment.profile.for_model(spec).gateway.long_prompt_tokens
    layouts = _layouts(current_of(deployment, None))
    bounds = Bounds(**doc["slo_bounds_ms"])
    print(
        f"{doc['profile']}: {len(requests)} requests of {doc['workload']['name']}, seed {doc['seed']}, "
        f"time scale {doc.get('time_scale', 1):g}"
    )
    print(f"{'pool':10} {'class':6} {'figure':9} {'predicted':>10} {'measured':>10} {'error':>8}")
    worst = 0.0
    predicted: list[Prediction] = []
    measured: list[Prediction] = []
    for pool, layout in layouts.items():
        if pool not in doc["pools"] or "error" in doc["pools"][pool]:
            continue
        pred = simulate(layout, requests, hw, bounds, long_tokens)
        meas = doc["pools"][pool]
        predicted.append(pred)
        measured.append(_measured(layout, meas))
        for cls in ("short", "long"):
            for key, name in FIGURES + CONTEXT:
                p = float(pred.classes[cls][key])
                m = float(meas["pdfleet"]["classes"].get(cls, {}).get(key, math.nan))
                e = _err(p, m)
                if (key, name) in FIGURES:
                    worst = max(worst, abs(e)) if math.isfinite(e) else math.inf
                print(f"{pool:10} {cls:6} {name:9} {p:10.1f} {m:10.1f} {e:+7.1f}%")
        client = meas["pdfleet"]["client"]
        for line in components(out_dir, pool, layout, requests, hw, long_tokens):
            print(line)
        print(
            f"{pool:10} client: event-loop lag P99 {client['p99_loop_lag_ms']:.1f} ms, schedule lateness P99 "
            f"{client['p99_schedule_lateness_ms']:.1f} ms (delivery jitter the model has none of)"
        )
    targets = targets_of(slo)
    pred_order = [r.prediction.layout.kind for r in rank(predicted, targets)]
    meas_order = [r.prediction.layout.kind for r in rank(measured, targets)]
    print(f"ranking predicted: {pred_order}; measured: {meas_order}")
    same = pred_order[:2] == meas_order[:2]
    verdict = "within" if worst <= BAR_PCT else "NOT within"
    print(f"worst error {worst:.1f}% ({verdict} {BAR_PCT:g}%); top two {'agree' if same else 'DISAGREE'}")


if __name__ == "__main__":
    main()
