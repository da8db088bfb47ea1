#!/usr/bin/env python3
"""How many concurrent streams one pdfleet-sim process keeps on schedule on one CPU core.

Starts `pdfleet-sim serve` pinned to one core, drives N concurrent streaming completions from this
process (pinned to another core; closed loop, each stream re-sends when its response ends) and compares
the simulator's simulated clock with the wall clock over the measurement window, from its
`pdfleet_sim_*` gauges:

    drift = (wall seconds the simulated clock fell behind during the window) / (window wall seconds)
          = (Δ lag of the latest step + Δ schedule given up by clock jumps) / window

Clients start evenly spread over one request's duration (the steady state of a long run; streams that
start together stay in lockstep in a deterministic model and turn every completion into a burst of 500
new HTTP requests). "On schedule" = drift under 5%. Rerunnable; not a test (timings vary by machine).

    .venv/bin/python bench/sim_capacity.py --streams 500 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from pdfleet.bench.arrivals import even_offsets
from pdfleet.bench.client import StreamClient, request_bytes
from pdfleet.bench.cpu import cpu_seconds
from pdfleet.bench.launch import SimProcess
from pdfleet.bench.load import run_closed
from pdfleet.bench.sim_clock import ON_SCHEDULE, clock_figures
from pdfleet.bench.workloads import SIM_MODEL, completion_body, synthetic_prompt
from pdfleet.metrics.scrape import scrape_metrics


async def drive(
    url: str,
    streams: int,
    prompt_tokens: int,
    output: int,
    warmup: float,
    duration: float,
    sim_pid: int,
    spread: float,
) -> dict[str, float]:
    """Run the clients (closed loop on kept-alive connections); measure over [warmup, warmup + duration]."""
    host, port = url.removeprefix("http://").split(":")
    body = completion_body(synthetic_prompt(prompt_tokens), output)
    request = request_bytes(host, int(port), "/v1/completions", body)
    client = StreamClient(host, int(port), parse=False)

    def probe() -> dict[str, float]:
        return {**scrape_metrics(url), "sim_cpu": cpu_seconds([sim_pid])}

    run = await run_closed(client, request, even_offsets(streams, spread), duration, warmup, probe)
    return clock_figures(run.before, run.after)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=500)
    ap.add_argument("--duration", type=float, default=30.0, help="measurement window, wall seconds")
    ap.add_argument("--warmup", type=float, default=8.0, help="wall seconds before measuring")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument(
        "--spread",
        type=float,
        default=None,
        help="wall seconds over which stream starts are spread (default: one request's duration "
        "estimated from the step model)",
    )
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--gpu", default="H100-SXM")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    sim_cpu, client_cpu = cpus[0], cpus[-1]
    os.sched_setaffinity(0, {client_cpu})
    sim_args = [
        SIM_MODEL,
        "--sim-gpu",
        args.gpu,
        "--sim-time-scale",
        str(args.time_scale),
        "--max-num-seqs",
        str(max(args.streams, 256)),
    ]
    spread = args.spread
    if spread is None:
        from pdfleet.sim.config import parse_serve_args

        perf = parse_serve_args(sim_args, env={}).perf()
        ctx = args.prompt_tokens + args.output_tokens // 2
        spread = args.output_tokens * perf.decode_time(args.streams, ctx) * args.time_scale
    if args.warmup < spread:
        args.warmup = spread + 2.0
    with SimProcess(sim_args, cpu=sim_cpu) as sim:
        assert sim.proc is not None
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        result = asyncio.run(
            drive(
                sim.url,
                args.streams,
                args.prompt_tokens,
                args.output_tokens,
                args.warmup,
                args.duration,
                sim.proc.pid,
                spread,
            )
        )
    drift = result["drift"]
    result.update(
        {
            "streams": args.streams,
            "time_scale": args.time_scale,
            "spread_s": spread,
            "on_schedule": drift < ON_SCHEDULE,
            "sim_cpu": sim_cpu,
            "client_cpu": client_cpu,
        }
    )
    print(json.dumps(result, indent=2))
    print(
        f"\n{args.streams} streams: drift {100 * drift:.2f}% (simulated vs wall), "
        f"{result['tokens_per_s_received']:.0f} tok/s delivered, sim process at "
        f"{100 * result['sim_cpu_util']:.0f}% of one core -> "
        f"{'ON' if result['on_schedule'] else 'OFF'} schedule"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["on_schedule"] else 1


if __name__ == "__main__":
    sys.exit(main())
