"""Does shadowing change what the clients see? The same seeded load through the gateway, A/B (issue 33).

Every run sends the very same requests at the very same arrivals without the pool header (the gateway's
live stage decides, as for real clients) and reads the client's figures per length class. On a
provisioned profile whose live stage keeps the shadowed class colocated, four runs: `off`; `shadow`
(`invoke shadow --stage S --share N`); `shadow, decode stopped` (the first decode instance's service
stopped); `off again`. Each request is a conversation of its own (X-Session-Id), as from many users,
since the gateway shadows by the sticky bucket. The noise is `off again` - `off` (nothing changed but
time); the shadow runs are shown with their difference from the mean of the two.

    flock /work/lab.lock .venv/bin/python bench/shadow_ab.py --profile lab-cross
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from invoke import Config, Context

from pdfleet.bench.compare import BenchPlan
from pdfleet.bench.fleet_targets import bench_model, gateway_of, read_client_key
from pdfleet.bench.load import Gateway, PoolRun, run_pool
from pdfleet.bench.stats import summarize
from pdfleet.bench.workloads import Item, build
from pdfleet.cli.bench import plan_from_options
from pdfleet.cli.options import open_deployment
from pdfleet.cli.settings import Settings
from pdfleet.fleet.deployment import Deployment
from pdfleet.ops.ssh import open_connection

REPO = Path(__file__).resolve().parents[1]
FIGURES = (  # the client's side, per class: what shadowing must leave alone
    ("ttft_p95", "p95_ttft_ms"),
    ("ttft_p99", "p99_ttft_ms"),
    ("itl_p95", "p95_itl_ms"),
    ("itl_p99", "p99_itl_ms"),
    ("tpot_p95", "p95_tpot_ms"),
    ("stalls/100", "stalls_per_100_streams"),
    ("failed", "failed"),
)
Figures = dict[str, dict[str, float]]


def _context() -> Context:
    config = Config(project_location=REPO)
    config.load_project()
    return Context(config)


def _invoke(*args: str) -> str:
    """One invoke task of this repo; its output (a failure stops the benchmark with its stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise SystemExit(f"invoke {' '.join(args)} failed ({proc.returncode}): {tail}")
    return proc.stdout.strip()


def _plan(deployment: Deployment, args: argparse.Namespace) -> BenchPlan:
    """The bench's plan for the workload at the rate, duration and seed asked (no warm-up: the runs
    follow each other on a warm fleet)."""
    opts: dict[str, Any] = dict.fromkeys(
        ("input_len", "output_len", "range_ratio", "long_share", "dataset", "concurrency", "num_prompts"),
        None,
    )
    opts |= {
        "workload": args.workload,
        "rate": args.rate,
        "duration": str(args.duration),
        "seed": args.seed,
        "burstiness": None,
        "pools": "colocated",
        "warmup": "0",
        "sweep": False,
        "trace": None,
    }
    return plan_from_options(deployment, opts)


def _gateway(deployment: Deployment) -> Gateway:
    spec = bench_model(deployment.profile, None)
    key = read_client_key(deployment.profile.gateway.client_key_file)
    return gateway_of(deployment.profile, deployment.topology, key, spec.aliases[0])


async def _run(gw: Gateway, plan: BenchPlan, items: list[Item]) -> PoolRun:
    """One run of the items by the plan's schedule, without the pool header."""
    return await run_pool(
        gw, "colocated", items, plan.schedule(items), plan.long_prompt_tokens, asyncio.Event(), forced=False
    )


def _by_class(run: PoolRun, plan: BenchPlan) -> Figures:
    """The client-side figures of one run per length class."""
    out = {}
    for cls in ("short", "long"):
        recs = [r for r in run.records if r.length_class == cls]
        s = summarize(recs, run.wall_s, plan.bounds, plan.time_scale)
        out[cls] = {name: float(s[key]) for name, key in FIGURES}
    return out


@contextmanager
def _decode_stopped(deployment: Deployment, settings: Settings) -> Iterator[str]:
    """The first decode instance's service stopped for the block, started again after it."""
    inst = deployment.topology.pool("decode")[0]
    host = deployment.inventory.hosts[inst.host]
    conn = open_connection(host, settings.known_hosts, settings.connect_timeout)
    try:
        conn.run(f"systemctl stop {inst.unit}", sudo=True)
        yield f"{inst.unit} on {inst.host}"
    finally:
        conn.run(f"systemctl start {inst.unit}", sudo=True)
        conn.close()


def _shadow_table(results: dict[str, Figures]) -> list[str]:
    """Each figure per class and run, the noise (off again - off) and each shadow run's difference
    from the mean of the two off runs."""
    names = list(results)
    lines = [f"{'class':6} {'figure':11} " + " ".join(f"{n[:22]:>22}" for n in names) + f" {'noise':>8}"]
    for cls in ("short", "long"):
        for fig, _ in FIGURES:
            base = (results["off"][cls][fig] + results["off again"][cls][fig]) / 2
            noise = results["off again"][cls][fig] - results["off"][cls][fig]
            cells = []
            for n in names:
                v = results[n][cls][fig]
                delta = "" if n.startswith("off") else f" ({v - base:+.1f})"
                cells.append(f"{f'{v:.1f}{delta}':>22}")
            lines.append(f"{cls:6} {fig:11} " + " ".join(cells) + f" {noise:+8.1f}")
    return lines


def shadow(args: argparse.Namespace) -> dict[str, Any]:
    """Off, shadow, shadow with decode stopped, off again; the table printed, the figures returned."""
    ctx = _context()
    settings = Settings.of(ctx)
    deployment = open_deployment(ctx, args.profile, None)
    plan = _plan(deployment, args)
    # one conversation per request, as from many users: without a session id every request of the one
    # key falls in the key's sticky bucket, and a share below 100% shadows all of them or none
    items = [
        replace(it, session=it.session or f"ab-{it.index}")
        for it in build(plan.workload, plan.request_count(), plan.seed)
    ]
    gw = _gateway(deployment)
    what = f"{len(items)} requests of {args.workload}, seed {plan.seed}, {plan.rate} req/s"
    print(f"{args.profile}: {what}, sent without the pool header")

    def run() -> Figures:
        return _by_class(asyncio.run(_run(gw, plan, items)), plan)

    def status() -> str:
        return _invoke("shadow.status", "--profile", args.profile)

    minutes = str(math.ceil((2 if args.no_decode_stop else 3) * args.duration / 60) + 1)
    start = ("shadow", "--profile", args.profile, "--stage", args.stage, "--share", str(args.share))
    results = {"off": run()}
    print("off: done")
    try:
        print(_invoke(*start, "--minutes", minutes, "--detach"))
        results["shadow"] = run()
        print(f"shadow: done; {status()}")
        if not args.no_decode_stop:
            with _decode_stopped(deployment, settings) as stopped:
                print(f"{stopped} stopped")
                results["shadow, decode stopped"] = run()
            print(f"shadow, decode stopped: done; {status()}")
    finally:
        print(_invoke("shadow.stop", "--profile", args.profile))
    results["off again"] = run()
    print("off again: done")
    print("\n".join(_shadow_table(results)))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="lab-cross", help="a provisioned profile with a P/D pool")
    ap.add_argument("--workload", default="long-prompt-mix", help="the bench workload (default: the mix)")
    ap.add_argument("--rate", default=None, help="requests/s (default: the bench's for the workload)")
    ap.add_argument("--duration", type=float, default=60, help="seconds of load per run (default 60)")
    ap.add_argument("--seed", default="0", help="the workload's seed (default 0)")
    ap.add_argument("--stage", default="long-prompts", help="the stage whose classes are shadowed")
    ap.add_argument("--share", type=int, default=20, help="percent of the stage's classes shadowed")
    ap.add_argument("--no-decode-stop", action="store_true", help="leave out the decode-stopped run")
    ap.add_argument("--json", default=None, help="write the figures of every run to this file")
    args = ap.parse_args()
    results = shadow(args)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
