#!/usr/bin/env python3
"""The stall, end to end over HTTP: 32 decoding streams, one 30K-token prompt arrives.

Runs it twice with real processes on loopback: a colocated simulator, then a producer + consumer pair
behind the real `vllm-router`. Prints the streams' worst inter-token gap (converted to simulated ms)
before and during the burst. The behaviour is asserted on the simulated clock by
tests/unit/sim/test_sim_engine.py; this is the same effect seen by a client. Rerunnable, not a test.

    .venv/bin/python bench/sim_interference.py --time-scale 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdfleet.bench.launch import RouterProcess, SimProcess, free_port  # noqa: E402

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def itl_buckets(url: str) -> dict[float, float]:
    """Cumulative counts of vllm:inter_token_latency_seconds by upper bound (simulated seconds)."""
    out: dict[float, float] = {}
    for line in urllib.request.urlopen(url + "/metrics", timeout=10).read().decode().splitlines():
        if line.startswith("vllm:inter_token_latency_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def worst_bucket(before: dict[float, float], after: dict[float, float]) -> str:
    """The smallest bucket bound that holds every gap observed between two scrapes ("<= 25 ms")."""
    total = after[float("inf")] - before[float("inf")]
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0.0) >= total:
            return f"<= {1e3 * bound:g} ms" if bound != float("inf") else "> 80 s"
    return "?"


class Stream(asyncio.Protocol):
    """One streaming completion; records the wall time of every read that carried SSE events."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if b"data: " in data:
            self.times.append(time.monotonic())


def http_post(host: str, port: int, body: dict[str, object]) -> bytes:
    raw = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(raw)}\r\n\r\n").encode() + raw


async def run(
    url: str, engine_url: str, streams: int, burst_tokens: int, window: float, scale: float
) -> tuple[float, float, str, str]:
    """Worst gap in the windows before and after the burst: client-side (simulated ms) and engine-side."""
    loop = asyncio.get_running_loop()
    host, port = url.removeprefix("http://").split(":")
    clients = []
    for _ in range(streams):
        _, proto = await loop.create_connection(Stream, host, int(port))
        body = {
            "model": MODEL,
            "prompt": "s" * 4096,
            "max_tokens": 100000,
            "ignore_eos": True,
            "stream": True,
        }
        proto.transport.write(http_post(host, int(port), body))
        clients.append(proto)
    await asyncio.sleep(window / 2)  # let every stream reach steady decoding
    b0 = itl_buckets(engine_url)
    await asyncio.sleep(window / 2)
    b1 = itl_buckets(engine_url)
    t_burst = time.monotonic()
    _, burst = await loop.create_connection(Stream, host, int(port))
    burst.transport.write(
        http_post(host, int(port), {"model": MODEL, "prompt": "b" * 4 * burst_tokens, "max_tokens": 4})
    )
    await asyncio.sleep(window)
    b2 = itl_buckets(engine_url)
    for c in (*clients, burst):
        c.transport.close()

    def worst(start: float, end: float) -> float:
        gaps = [
            b - a
            for c in clients
            for a, b in zip(c.times, c.times[1:], strict=False)
            if start <= a and b <= end
        ]
        return 1e3 * max(gaps) / scale if gaps else float("nan")

    return (
        worst(t_burst - window / 2, t_burst),
        worst(t_burst, t_burst + window),
        worst_bucket(b0, b1),
        worst_bucket(b1, b2),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--burst-tokens", type=int, default=30000)
    ap.add_argument("--window", type=float, default=3.0, help="wall seconds before and after the burst")
    args = ap.parse_args()
    common = [MODEL, "--sim-time-scale", str(args.time_scale), "--disable-log-stats"]
    with SimProcess(common) as colo:
        colo_before, colo_after, colo_b, colo_a = asyncio.run(
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
        pd_before, pd_after, pd_b, pd_a = asyncio.run(
            run(router.url, d.url, args.streams, args.burst_tokens, args.window, args.time_scale)
        )
    print(
        f"worst inter-token gap of {args.streams} streams, simulated ms "
        f"(one {args.burst_tokens}-token prompt "
        f"arrives; time scale {args.time_scale}):"
    )
    for name, before, after, hb, ha in (
        ("colocated", colo_before, colo_after, colo_b, colo_a),
        ("P/D pair ", pd_before, pd_after, pd_b, pd_a),
    ):
        print(f"  {name}: client {before:7.1f} -> {after:7.1f}   engine ITL histogram {hb} -> {ha}")
    print("(client = wall-clock gaps / time scale, incl. router and CPU jitter; engine = vLLM metric)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
