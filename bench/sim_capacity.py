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
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdfleet.bench.launch import SimProcess  # noqa: E402
from pdfleet.metrics.scrape import scrape_metrics  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class StreamClient(asyncio.Protocol):
    """One keep-alive connection sending streaming completions back to back; counts SSE events.

    A raw protocol rather than an HTTP client library, so the client core is not the bottleneck.
    """

    def __init__(self, request: bytes, counts: list[int], stop: asyncio.Event) -> None:
        self.request = request
        self.counts = counts
        self.stop = stop
        self.transport: asyncio.Transport | None = None
        self.tail = b""
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.counts[0] += data.count(b"data: ")
        window = self.tail + data
        self.tail = window[-16:]
        if b"data: [DONE]" in window:
            self.counts[0] -= 1  # [DONE] is not a token
            self.counts[1] += 1
            self.tail = b""
            if not self.stop.is_set():
                self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


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
    """Run the clients; measure over [warmup, warmup + duration]."""
    counts = [0, 0]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    body = json.dumps(
        {
            "model": MODEL,
            "prompt": "x" * (4 * prompt_tokens),
            "max_tokens": output,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    host, port = url.removeprefix("http://").split(":")
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    clients: list[StreamClient] = []
    for _ in range(streams):
        _, proto = await loop.create_connection(lambda: StreamClient(request, counts, stop), host, int(port))
        clients.append(proto)
    for i, client in enumerate(clients):
        loop.call_later(spread * i / streams, client.send)
    await asyncio.sleep(warmup)
    m0, c0, t0, n0 = scrape_metrics(url), cpu_seconds(sim_pid), time.monotonic(), counts[0]
    await asyncio.sleep(duration)
    m1, c1, t1, n1 = scrape_metrics(url), cpu_seconds(sim_pid), time.monotonic(), counts[0]
    stop.set()
    for client in clients:
        assert client.transport is not None
        client.transport.close()
    lost = (
        m1["pdfleet_sim_lag_seconds"]
        - m0["pdfleet_sim_lag_seconds"]
        + m1["pdfleet_sim_resync_lost_wall_seconds"]
        - m0["pdfleet_sim_resync_lost_wall_seconds"]
    )
    busy_sim = m1["pdfleet_sim_busy_simulated_seconds"] - m0["pdfleet_sim_busy_simulated_seconds"]
    busy_wall = m1["pdfleet_sim_busy_wall_seconds"] - m0["pdfleet_sim_busy_wall_seconds"]
    steps = m1["pdfleet_sim_steps"] - m0["pdfleet_sim_steps"]
    return {
        "window_s": t1 - t0,
        "drift": lost / (t1 - t0),
        "lag_ms_at_end": 1e3 * m1["pdfleet_sim_lag_seconds"],
        "running_at_end": m1["vllm:num_requests_running"],
        "waiting_at_end": m1["vllm:num_requests_waiting"],
        "steps_per_s": steps / (t1 - t0),
        "mean_step_ms_simulated": 1e3 * busy_sim / max(steps, 1),
        "tokens_per_s_received": (n1 - n0) / (t1 - t0),
        "busy_simulated_s": busy_sim,
        "busy_wall_s": busy_wall,
        "resyncs_in_window": m1["pdfleet_sim_resyncs"] - m0["pdfleet_sim_resyncs"],
        "max_lag_ms_ever": 1e3 * m1["pdfleet_sim_max_lag_seconds"],
        "sim_cpu_util": (c1 - c0) / (t1 - t0),
        "completed_requests": float(counts[1]),
    }


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
        MODEL,
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
            "on_schedule": drift < 0.05,
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
