"""Is `invoke plan`'s prediction what `invoke bench` measures? Prediction against a bench run, side by side.

Reads an `invoke bench` output directory (results.json: profile, workload, seed, rate, prompts), rebuilds
the very same requests and arrivals, predicts each benched pool as a layout (the profile's pools: the
colocated pool's instances, or the P/D pool's prefill and decode instances taking every request, as the
bench sends them) and prints TTFT and ITL P95 per length class, predicted against measured, with the
error, and the two pools' ranking by the plan's rule on both. The issue's bar: within 15%, same ranking.
The comparison is `invoke plan --validate`'s (pdfleet.plan.validate, pdfleet.plan.gaps); this script
reads a bench run made by hand (any profile, inventory or time scale) instead of running one.

The bench run itself goes through the lab (one lab per machine, under its lock):

    flock /work/lab.lock sh -c '.venv/bin/invoke lab.up && .venv/bin/invoke provision --profile lab-cross \\
        && .venv/bin/invoke bench --profile lab-cross --duration 60 --seed 0 --out out/fidelity-cross; \\
        .venv/bin/invoke lab.down'
    .venv/bin/python bench/plan_fidelity.py out/fidelity-cross
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from invoke import Config, Context

from pdfleet.bench.fleet_targets import bench_model
from pdfleet.bench.stats import Bounds
from pdfleet.cli.options import open_deployment
from pdfleet.cli.plan_fleet import current_of, hardware_of, targets_of
from pdfleet.cli.plan_validate import component_report
from pdfleet.plan.predict import simulate
from pdfleet.plan.traffic import requests_of_results
from pdfleet.plan.validate import lines, pool_layouts, validate

REPO = Path(__file__).resolve().parents[1]


def _context() -> Context:
    config = Config(project_location=REPO)
    config.load_project()
    return Context(config)


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
    requests = requests_of_results(doc)
    hw = hardware_of(deployment, None)
    long_tokens = deployment.profile.for_model(spec).gateway.long_prompt_tokens
    layouts = pool_layouts(current_of(deployment, None).pools)
    bounds = Bounds(**doc["slo_bounds_ms"])
    print(
        f"{doc['profile']}: {len(requests)} requests of {doc['workload']['name']}, seed {doc['seed']}, "
        f"time scale {doc.get('time_scale', 1):g}"
    )
    benched = {p: lay for p, lay in layouts.items() if p in doc["pools"] and "error" not in doc["pools"][p]}
    preds = {p: simulate(lay, requests, hw, bounds, long_tokens) for p, lay in benched.items()}
    for line in lines(validate(preds, doc["pools"], targets_of(spec.slo))):
        print(line)
    for line in component_report(out_dir, doc, benched, requests, hw, long_tokens):
        print(line)


if __name__ == "__main__":
    main()
