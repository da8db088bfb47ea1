"""How fast `invoke plan` predicts: N layouts x S seconds of simulated traffic, wall time and the ratio of
simulated to real time (per layout and per worker), on this machine.

The issue's target: at least 50 layouts x 10 minutes of traffic at the profile's rate in under 2 minutes.
Defaults: lab-cross's hardware (H100, Llama-3.1-8B, RoCE 400G; --profile/--inventory another's: its
`vllm.sim` GPU and link, its model, its pools' memory settings and threshold), the long-prompt mix at
invoke bench's 3 req/s, 8 GPUs of one GPU per host (TP 1: the lab's hosts), every layout the search keeps.

    .venv/bin/python bench/plan_speed.py [--profile lab-cross] [--inventory FILE] [--gpus 8] [--duration 600]
        [--rate 3] [--workers 2] [--max-tp 1] [--limit 50]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from invoke import Config, Context

from pdfleet.bench.compare import BenchPlan
from pdfleet.bench.fleet_targets import bench_model
from pdfleet.bench.stats import Bounds
from pdfleet.bench.workloads import WorkloadSpec
from pdfleet.cli.options import open_deployment
from pdfleet.cli.plan_fleet import hardware_of
from pdfleet.plan.run import default_workers, predict_all
from pdfleet.plan.space import TP_SIZES, search_space
from pdfleet.plan.traffic import load_of, requests_of

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="lab-cross", help="whose hardware, model and threshold (lab-cross)")
    ap.add_argument("--inventory", default=None, help="its inventory (default: the lab's, as invoke plan)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs to lay out (default 8)")
    ap.add_argument("--duration", type=float, default=600.0, help="simulated s of traffic (default 600)")
    ap.add_argument("--rate", type=float, default=3.0, help="requests/s (default 3, invoke bench's mix rate)")
    ap.add_argument("--workers", type=int, default=default_workers(), help="processes (default: cores)")
    ap.add_argument("--max-tp", type=int, default=1, help="largest TP size (default 1: one GPU per host)")
    ap.add_argument("--limit", type=int, default=0, help="simulate only the first N layouts (0: all)")
    args = ap.parse_args()

    config = Config(project_location=REPO)
    config.load_project()
    deployment = open_deployment(Context(config), args.profile, args.inventory)
    hw = hardware_of(deployment, None)
    gateway = deployment.profile.for_model(bench_model(deployment.profile, None)).gateway
    long_tokens = gateway.long_prompt_tokens
    t0 = time.perf_counter()
    requests = requests_of(BenchPlan(WorkloadSpec(input_len=512), rate=args.rate, duration_s=args.duration))
    traffic_s = time.perf_counter() - t0
    keep, cut = search_space(args.gpus, load_of(requests, 60), hw, [t for t in TP_SIZES if t <= args.max_tp])
    if args.limit:
        keep = keep[: args.limit]
    t1 = time.perf_counter()
    cpu0 = _cpu()
    predict_all(keep, requests, hw, Bounds(3000, 60, 250), long_tokens, args.workers)
    wall = time.perf_counter() - t1
    cpu = _cpu() - cpu0
    simulated = requests[-1].at
    per_layout = wall * args.workers / len(keep)
    print(
        f"{args.profile}: {hw.gpu.name}, {hw.model.name}, {hw.link.name}; "
        f"{args.gpus} GPUs, TP <= {args.max_tp}"
    )
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print(f"traffic: {len(requests)} requests over {simulated:.0f} simulated s, built in {traffic_s:.1f} s")
    print(f"layouts: {len(keep)} simulated ({len(cut)} cut) on {args.workers} worker(s): {wall:.1f} s wall")
    print(
        f"per layout: {per_layout:.2f} worker-s for {simulated:.0f} s of traffic = "
        f"{simulated / per_layout:.0f}x real time; all layouts: "
        f"{len(keep) * simulated / wall:.0f} simulated s per wall s"
    )
    print(
        f"CPU: {cpu:.1f} s in all ({cpu / len(keep):.2f} s a layout, "
        f"{simulated * len(keep) / cpu:.0f}x real time "
        f"per CPU-second); on {args.workers} free core(s) that is {cpu / args.workers:.1f} s wall"
    )
    met = wall < 120 and len(keep) >= 50
    print(f"target (50 layouts x 600 s in < 120 s wall): {'met' if met else 'NOT met'}")


def _cpu() -> float:
    """User + system CPU seconds of this process and its finished workers."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    main()
