#!/usr/bin/env python3
"""The stall, end to end over HTTP: 32 decoding streams, one 30K-token prompt arrives.

Runs it twice with real processes on loopback: a colocated simulator, then a producer + consumer pair
behind the real `vllm-router`. Prints the streams' worst inter-token gap (converted to simulated ms)
before and during the burst. The behaviour is asserted on the simulated clock by
tests/unit/sim/test_des.py; this is the same effect seen by a client. Rerunnable, not a test.

    .venv/bin/python bench/sim_interference.py --time-scale 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.bench.stats import histogram_bound, itl_within
from pdfleet.bench.workloads import SIM_MODEL, completion_body, synthetic_prompt
from pdfleet.metrics.scrape import scrape_histogram

ITL = "vllm:inter_token_latency_seconds"
LAGS = ("pdfleet_sim_loop_lag_seconds", "pdfleet_sim_step_lag_seconds")  # the simulator's own lateness
DISTURBED_S = 0.1  # a probe or step later than this (wall seconds) marks its window disturbed


def late_count(engine_url: str) -> float:
    """Loop probes and steps that ran more than DISTURBED_S late so far (cumulative; take deltas)."""
    total = 0.0
    for name in LAGS:
        hist = scrape_histogram(engine_url, name)
        total += hist[math.inf] - hist[DISTURBED_S]
    return total


def disturbed(late: float) -> str:
    """How a window is marked in the report."""
    return f"  DISTURBED ({late:.0f} late probes/steps)" if late else ""


def bucket_label(bound: float) -> str:
    """A histogram bound as the report shows it ("<= 25 ms"; beyond the last finite bucket, 80 s)."""
    return f"<= {1e3 * bound:g} ms" if bound != math.inf else "> 80 s"


def completions_client(url: str, body: dict[str, object]) -> tuple[StreamClient, bytes]:
    """A client for url (one kept-alive connection per concurrent stream) and its /v1/completions request."""
    host, port = url.removeprefix("http://").split(":")
    request = request_bytes(host, int(port), "/v1/completions", body)
    return StreamClient(host, int(port), parse=False), request


async def run(
    url: str, engine_url: str, streams: int, burst_tokens: int, window: float, scale: float
) -> tuple[float, float, str, str, float]:
    """Worst gap in the windows before and after the burst: client-side (simulated ms) and engine-side.

    The last figure: how many loop probes or steps of the simulator ran late in the two windows.
    """
    client, request = completions_client(url, completion_body(synthetic_prompt(1024, "s"), 100000))
    recs = [Record() for _ in range(streams)]
    tasks = [asyncio.create_task(client.run(request, rec)) for rec in recs]
    await asyncio.sleep(window / 2)  # let every stream reach steady decoding
    b0 = scrape_histogram(engine_url, ITL)
    late0 = late_count(engine_url)
    await asyncio.sleep(window / 2)
    b1 = scrape_histogram(engine_url, ITL)
    t_burst = time.perf_counter()
    burst_body = completion_body(synthetic_prompt(burst_tokens, "b"), 4, stream=False, ignore_eos=False)
    burst, burst_request = completions_client(url, burst_body)
    tasks.append(asyncio.create_task(burst.run(burst_request, Record())))
    await asyncio.sleep(window)
    b2 = scrape_histogram(engine_url, ITL)
    late = late_count(engine_url) - late0
    client.close()
    burst.close()
    await asyncio.gather(*tasks)

    def worst(start: float, end: float) -> float:
        gaps = [g for rec in recs for g in itl_within(rec.chunks, start, end)]
        return 1e3 * max(gaps) / scale if gaps else float("nan")

    return (
        worst(t_burst - window / 2, t_burst),
        worst(t_burst, t_burst + window),
        bucket_label(histogram_bound(b0, b1)),
        bucket_label(histogram_bound(b1, b2)),
        late,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=0.5, help="the simulators' --sim-time-scale")
    ap.add_argument("--streams", type=int, default=32, help="decoding streams")
    ap.add_argument("--burst-tokens", type=int, default=30000, help="the arriving prompt's length")
    ap.add_argument("--window", type=float, default=3.0, help="wall seconds before and after the burst")
    args = ap.parse_args()
    common = [SIM_MODEL, "--sim-time-scale", str(args.time_scale), "--disable-log-stats"]
    with SimProcess(common) as colo:
        colo_before, colo_after, colo_b, colo_a, colo_late = asyncio.run(
            run(colo.url, colo.url, args.streams, args.burst_tokens, args.window, args.time_scale)
        )
    side = free_port()
    kv = '{"kv_connector":"NixlConnector","kv_role":"%s"}'
    producer = SimProcess(
        [*common, "--kv-transfer-config", kv % "kv_producer"],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess([*common, "--sim-link", "roce-400g", "--kv-transfer-config", kv % "kv_consumer"])
    with producer as p, consumer as d, RouterProcess([p.url], [d.url]) as router:
        pd_before, pd_after, pd_b, pd_a, pd_late = asyncio.run(
            run(router.url, d.url, args.streams, args.burst_tokens, args.window, args.time_scale)
        )
    print(
        f"worst inter-token gap of {args.streams} streams, simulated ms "
        f"(one {args.burst_tokens}-token prompt "
        f"arrives; time scale {args.time_scale}):"
    )
    for name, before, after, hb, ha, late in (
        ("colocated", colo_before, colo_after, colo_b, colo_a, colo_late),
        ("P/D pair ", pd_before, pd_after, pd_b, pd_a, pd_late),
    ):
        print(
            f"  {name}: client {before:7.1f} -> {after:7.1f}   engine ITL histogram {hb} -> {ha}"
            + disturbed(late)
        )
    print("(client = wall-clock gaps / time scale, incl. router and CPU jitter; engine = vLLM metric;")
    print(f" DISTURBED = the simulator itself ran > {1e3 * DISTURBED_S:.0f} ms late in those windows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
