#!/usr/bin/env python3
r"""Host CPU out of the simulated clock: a colocated simulator's long-prompt TTFT against the GPU model's.

Sends the same schedule twice to a real `pdfleet-sim serve` on loopback (prefix caching on, the lab's
8192-token budget): short streams (256-token prompts, 128 tokens out) every 0.2 s and a 24.7K-token
prompt every 2.5 s, each prompt unique. Once on a quiet host, once with a CPU burner on the other core
(the simulator pinned to core 0, the burner to core 1). Each run's arrivals, as the client sent them,
are then replayed through the discrete-event driver (`pdfleet.sim.des`, the same engine on a purely
simulated clock): what the GPU model says those requests' TTFT is, with no host in the way. Prints the
long prompts' TTFT both ways (simulated ms) and the difference, the simulator's wall seconds of waiting
for intake (`pdfleet_sim_intake_wait_seconds`), the steps that went on without a request still in
intake (`pdfleet_sim_intake_missed_steps`) and its worst step lag (a token written late, wall ms).

    .venv/bin/python bench/sim_host_cpu.py                 # quiet and loaded
    cd OLD_TREE && PYTHONPATH=THIS_TREE PDFLEET_SIM_PYTHONPATH=OLD_TREE THIS_TREE/.venv/bin/python \
        THIS_TREE/bench/sim_host_cpu.py    # the simulator of another tree (python -m runs from the cwd)

Rerunnable, not a test (tests/unit/sim/test_runtime.py holds the rule on a small case).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import cast

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.launch import SimProcess
from pdfleet.bench.workloads import SIM_MODEL, completion_body, synthetic_prompt
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.des import EngineNode, Simulation
from pdfleet.sim.engine import SimRequest
from pdfleet.tokens import CharEstimate, count_request_tokens

BURNER = "while True: pass\n"


@dataclass
class Sent:
    """One planned request and what the client saw."""

    due: float  # wall s from the run's start
    body: dict[str, object]
    long: bool
    rec: Record


def plan(longs: int, long_tokens: int, every: float, short_every: float) -> list[Sent]:
    """The schedule: short streams throughout, a long prompt every `every` s from 1 s on; unique prompts."""
    span = 1.0 + longs * every
    out = [
        Sent(
            i * short_every,
            completion_body(f"s{i:07d}" + synthetic_prompt(256, "s"), 128),
            False,
            Record(),
        )
        for i in range(int(span / short_every))
    ]
    out += [
        Sent(
            1.0 + k * every,
            completion_body(f"L{k:07d}" + synthetic_prompt(long_tokens, "L"), 4),
            True,
            Record(),
        )
        for k in range(longs)
    ]
    return sorted(out, key=lambda s: s.due)


async def drive(url: str, sent: list[Sent]) -> float:
    """Send every request at its due time (open loop); the perf_counter time of the run's start."""
    host, port = url.removeprefix("http://").split(":")
    client = StreamClient(host, int(port), parse=False)
    t0 = time.perf_counter()
    tasks = []
    for s in sent:
        delay = t0 + s.due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        request = request_bytes(host, int(port), "/v1/completions", s.body)
        tasks.append(asyncio.create_task(client.run(request, s.rec)))
    await asyncio.gather(*tasks)
    client.close()
    return t0


def replay(args: list[str], sent: list[Sent], t0: float, scale: float) -> list[float]:
    """Each request's TTFT (simulated s) in the discrete-event model, arriving when the client sent it."""
    sim = Simulation()
    node = EngineNode(sim, parse_serve_args(args).engine())
    counter = CharEstimate()
    records = {}

    def arrive(i: int, s: Sent) -> None:
        prompt = count_request_tokens(s.body, counter)
        records[i] = node.submit(SimRequest(f"r{i}", prompt, cast(int, s.body["max_tokens"])))

    for i, s in enumerate(sent):
        sim.at((s.rec.start - t0) / scale, arrive, i, s)
    sim.run()
    return [records[i].ttft for i in range(len(sent))]


def run(
    args: list[str], sent: list[Sent], scale: float, loaded: bool
) -> tuple[list[float], list[float], tuple[float, float, float]]:
    """One run: (live TTFTs, model TTFTs) of the long prompts in simulated s, and the simulator's intake
    wait (wall s), the steps it missed and its worst step lag (wall s)."""
    env = (
        {"PYTHONPATH": os.environ["PDFLEET_SIM_PYTHONPATH"]}
        if "PDFLEET_SIM_PYTHONPATH" in os.environ
        else None
    )
    burner = None
    if loaded:
        burner = subprocess.Popen(
            [sys.executable, "-c", BURNER], preexec_fn=lambda: os.sched_setaffinity(0, {1})
        )
    try:
        with SimProcess(args, env=env, cpu=0, timeout=60) as sim:
            t0 = asyncio.run(drive(sim.url, sent))
            got = scrape_metrics(sim.url)  # an older simulator exports no intake figures
            nan = float("nan")
            waited = (
                got.get("pdfleet_sim_intake_wait_seconds_total", nan),
                got.get("pdfleet_sim_intake_missed_steps_total", nan),
                got["pdfleet_sim_max_lag_seconds"],
            )
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    errors = [s.rec.error for s in sent if s.rec.error]
    if errors:
        raise SystemExit(f"{len(errors)} requests failed: {errors[0]}")
    model = replay(args, sent, t0, scale)
    live = [s.rec.ttft / scale for s in sent if s.long]
    des = [t for t, s in zip(model, sent, strict=True) if s.long]
    return live, des, waited


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=1.0, help="the simulator's --sim-time-scale")
    ap.add_argument("--longs", type=int, default=8, help="long prompts per run")
    ap.add_argument("--long-tokens", type=int, default=24700, help="a long prompt's length")
    ap.add_argument("--every", type=float, default=2.5, help="wall s between long prompts")
    ap.add_argument("--short-every", type=float, default=0.2, help="wall s between short streams")
    ap.add_argument("--only", choices=("quiet", "loaded"), help="run one of the two (default: both)")
    a = ap.parse_args()
    args = [
        SIM_MODEL,
        "--sim-time-scale",
        str(a.time_scale),
        "--max-num-batched-tokens",
        "8192",
        "--enable-prefix-caching",
        "--disable-log-stats",
    ]
    print(f"{a.longs} prompts of {a.long_tokens} tokens among short streams; TTFT in simulated ms")
    print(
        f"{'host':7} {'live mean':>10} {'model mean':>10} {'diff':>8} {'rel':>7} {'worst diff':>10} "
        f"{'intake wait':>11} {'missed':>6} {'max lag':>8}"
    )
    for name in ("quiet", "loaded"):
        if a.only and a.only != name:
            continue
        sent = plan(a.longs, a.long_tokens, a.every, a.short_every)
        live, des, (waited, missed, lag) = run(args, sent, a.time_scale, name == "loaded")
        lm, dm = statistics.fmean(live), statistics.fmean(des)
        worst = max((x - y for x, y in zip(live, des, strict=True)), key=abs)
        print(
            f"{name:7} {1e3 * lm:10.1f} {1e3 * dm:10.1f} {1e3 * (lm - dm):+8.1f} "
            f"{100 * (lm - dm) / dm:+6.2f}% {1e3 * worst:+10.1f} {waited:10.3f}s {missed:6.0f} "
            f"{1e3 * lag:6.1f}ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
