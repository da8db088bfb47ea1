"""Does shadowing change what the clients see? The same seeded load through the gateway, A/B.

Issue 33's bar: shadowing a share of long prompts changes the primary's figures by no more than the
run-to-run noise, and so does the decode service stopping mid-shadow. Four runs of the very same
requests and arrivals, sent without the pool header (the gateway's live stage decides, as for real
clients; the stage must keep the shadowed class colocated, or there is nothing to shadow):

1. `off`: no shadow run;
2. `shadow`: `invoke shadow --stage S --share N` on every gateway of the profile;
3. `shadow, decode stopped`: the same with the first decode host's decode service stopped;
4. `off again`: the shadow run stopped, the decode service started.

The noise is the difference between runs 1 and 4 (nothing changed but time); each figure of runs 2 and
3 is printed beside it, with its difference from the mean of 1 and 4. Through the lab (one per machine,
under its lock; lab-cross provisioned):

    flock /work/lab.lock .venv/bin/python bench/shadow_ab.py --profile lab-cross --duration 60
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
from pathlib import Path
from typing import Any

from invoke import Config, Context

from pdfleet.bench.client import Record
from pdfleet.bench.fleet_targets import bench_model, gateway_of, read_client_key
from pdfleet.bench.load import Gateway, run_pool
from pdfleet.bench.stats import summarize
from pdfleet.bench.workloads import build
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


def _context() -> Context:
    config = Config(project_location=REPO)
    config.load_project()
    return Context(config)


def _invoke(*args: str) -> str:
    """One invoke task of this repo; its output (a failure stops the benchmark with its stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise SystemExit(f"invoke {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


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


def _by_class(records: list[Record], wall_s: float, plan: Any) -> dict[str, dict[str, float]]:
    """The client-side figures of one run per length class."""
    out = {}
    for cls in ("short", "long"):
        recs = [r for r in records if r.length_class == cls]
        s = summarize(recs, wall_s, plan.bounds, plan.time_scale)
        out[cls] = {name: float(s[key]) for name, key in FIGURES}
    return out


async def _run(gw: Gateway, plan: Any, items: list[Any]) -> dict[str, dict[str, float]]:
    """One run of the items by the plan's schedule, unforced; its figures per class."""
    run = await run_pool(
        gw, "colocated", items, plan.schedule(items), plan.long_prompt_tokens, asyncio.Event(), forced=False
    )
    return _by_class(run.records, run.wall_s, plan)


def _table(results: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Each figure per class and run, the noise (off again - off) and each shadow run's difference
    from the mean of the two off runs."""
    names = list(results)
    lines = [f"{'class':6} {'figure':11} " + " ".join(f"{n[:22]:>22}" for n in names) + f" {'noise':>8}"]
    for cls in ("short", "long"):
        for fig, _ in FIGURES:
            vals = [results[n][cls][fig] for n in names]
            base = (results["off"][cls][fig] + results["off again"][cls][fig]) / 2
            noise = results["off again"][cls][fig] - results["off"][cls][fig]
            cells = []
            for n, v in zip(names, vals, strict=True):
                delta = "" if n.startswith("off") else f" ({v - base:+.1f})"
                cells.append(f"{f'{v:.1f}{delta}':>22}")
            lines.append(f"{cls:6} {fig:11} " + " ".join(cells) + f" {noise:+8.1f}")
    return lines


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
    ctx = _context()
    settings = Settings.of(ctx)
    deployment = open_deployment(ctx, args.profile, None)
    spec = bench_model(deployment.profile, None)
    opts = dict.fromkeys(
        ("input_len", "output_len", "range_ratio", "long_share", "dataset", "concurrency", "num_prompts"),
        None,
    ) | {
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
    plan = plan_from_options(deployment, opts)
    items = build(plan.workload, plan.request_count(), plan.seed)
    key = read_client_key(deployment.profile.gateway.client_key_file)
    gw = gateway_of(deployment.profile, deployment.topology, key, spec.aliases[0])
    what = f"{len(items)} requests of {args.workload}, seed {plan.seed}, {plan.rate} req/s"
    print(f"{args.profile}: {what}, sent without the pool header")
    minutes = str(math.ceil((2 if args.no_decode_stop else 3) * args.duration / 60) + 1)
    shadow = ("--profile", args.profile, "--stage", args.stage, "--share", str(args.share))
    results: dict[str, dict[str, dict[str, float]]] = {"off": asyncio.run(_run(gw, plan, items))}
    print("off: done")
    try:
        print(_invoke("shadow", *shadow, "--minutes", minutes, "--detach"))
        results["shadow"] = asyncio.run(_run(gw, plan, items))
        print(f"shadow: done; {_invoke('shadow.status', '--profile', args.profile)}")
        if not args.no_decode_stop:
            with _decode_stopped(deployment, settings) as what:
                print(f"{what} stopped")
                results["shadow, decode stopped"] = asyncio.run(_run(gw, plan, items))
            print(f"shadow, decode stopped: done; {_invoke('shadow.status', '--profile', args.profile)}")
    finally:
        print(_invoke("shadow.stop", "--profile", args.profile))
    results["off again"] = asyncio.run(_run(gw, plan, items))
    print("off again: done")
    print("\n".join(_table(results)))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
