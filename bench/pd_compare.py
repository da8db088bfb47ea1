#!/usr/bin/env python3
"""`invoke bench`'s library end to end on loopback: the same seeded workload through pdfleet-gateway to a
colocated pool (2 simulators) and a P/D pool (prefill + decode simulators behind the real vllm-router).

Writes results.json, vllm-<pool>.json, requests.jsonl, report.md, report.html and the plots into --out,
and prints the headline table and the verdict. Rerunnable, not a test.

    .venv/bin/python bench/pd_compare.py --rate 2 --duration 60 --out out/pd-compare
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from pdfleet.bench.compare import BenchPlan, PoolTarget, run_compare
from pdfleet.bench.local_fleet import LocalFleet
from pdfleet.bench.report import HEADLINE, headline_rows, markdown_table, write_all
from pdfleet.bench.stats import Bounds
from pdfleet.bench.verdict import Thresholds
from pdfleet.bench.workloads import WorkloadSpec
from pdfleet.metrics.direct import DirectScrape
from pdfleet.model.connectors import NIXL
from pdfleet.model.monitoring import kv_transfer_series
from pdfleet.model.vllm_release_data import NEWEST


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="long-prompt-mix")
    ap.add_argument("--rate", type=float, default=2.0, help="requests/s (simulated)")
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds of arrivals")
    ap.add_argument("--long-share", type=float, default=0.1)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--colocated-budget",
        type=int,
        default=8192,
        help="max-num-batched-tokens of the colocated simulators (lab-cross: 8192)",
    )
    ap.add_argument("--stall-ms", type=float, default=500.0, help="a stall: a gap over this (lab-cross: 250)")
    ap.add_argument("--out", default="out/pd-compare")
    args = ap.parse_args()
    plan = BenchPlan(
        WorkloadSpec(args.workload, input_len=512, output_len=256, long_share=args.long_share),
        seed=args.seed,
        rate=args.rate,
        duration_s=args.duration,
        time_scale=args.time_scale,
        bounds=Bounds(3000.0, 60.0, args.stall_ms),
    )
    thresholds = Thresholds(3000.0, 60.0, 500.0, 100.0)
    sim_args = ["--sim-time-scale", str(args.time_scale)]
    # the loopback fleet's NixlConnector on the simulator's default release: its KV histogram, from the table
    series = kv_transfer_series(NIXL, NEWEST)
    kv = series.histogram if series is not None else None
    with LocalFleet(colocated=2, sim_args=sim_args, colocated_budget=args.colocated_budget) as fleet:
        targets = {
            p: PoolTarget(
                p, fleet.gpus(p), DirectScrape(fleet.targets(p)), DirectScrape(fleet.targets(p)), 0, kv
            )
            for p in ("colocated", "disagg")
        }
        result = asyncio.run(run_compare(plan, fleet.gateway, targets, asyncio.Event()))
    doc, verdict = write_all(Path(args.out), result, fleet.gateway.model, "local (loopback)", thresholds)
    print("\n".join(markdown_table(HEADLINE, headline_rows(doc))))
    print(verdict.headline)
    print(f"report: {Path(args.out) / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
