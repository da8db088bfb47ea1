"""The gateway-overhead benchmark's runs and rows: TTFT through each target per concurrency, and throughput.

Latency: per concurrency level the targets are interleaved over `rounds` (open-loop Poisson arrivals,
the same for every target, or closed-loop burst/staggered workers), samples pooled per target into
one row. Throughput: one closed-loop run per target with many fast streams. `bench/gateway_overhead.py`
is the script (its docstring says what is measured and why); `gateway_overhead_report` the tables.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from pdfleet.bench.arrivals import poisson_starts, stagger_offsets
from pdfleet.bench.client import StreamClient, request_bytes
from pdfleet.bench.load import LoadRun, run_closed, run_open
from pdfleet.bench.proxies import PATH, Target
from pdfleet.bench.stats import NAN, durations, mean_in_flight, mean_ms, pct_ms
from pdfleet.bench.upstream import paced_body


@dataclass(frozen=True)
class OverheadConfig:
    """The benchmark's settings (the script's options of the same names)."""

    concurrency: list[int]
    duration: float = 16.0  # measured s per latency cell, over all rounds
    rounds: int = 2
    tp_duration: float = 8.0
    warmup: float = 2.0
    tokens: int = 64
    first_ms: float = 20.0
    gap_ms: float = 25.0
    tp_streams: int = 200
    tp_tokens: int = 2000
    tp_gap_ms: float = 1.0
    arrivals: str = "poisson"  # poisson | burst | staggered
    connections: str = "keepalive"  # keepalive | close
    seed: int = 1
    stream_ms: float | None = None  # poisson: mean stream length; None: measured by a pilot run
    drain: float = 10.0

    @property
    def keepalive(self) -> bool:
        """Whether streams reuse connections from a client pool."""
        return self.connections == "keepalive"


def summarise(target: Target, streams: int, run: LoadRun) -> dict:
    """One result row (lists of seconds kept for merge(), which drops them)."""
    now = time.perf_counter()
    stats, window = run.stats, run.window()
    ttft = sorted(stats.ttft)
    late = sorted(run.lateness)
    lengths = durations(run.records)
    secs, cpu = window["t"], window["proxy_cpu"]
    return {
        "ttft": ttft,
        "lateness": late,
        "durations": lengths,
        "target": target.name,
        "streams": streams,
        "requests": len(ttft),
        "done": stats.done,
        "failed": stats.failed + run.unfinished,
        "unfinished": run.unfinished,
        "connects": stats.connects,
        "stale": stats.stale,
        "window_s": secs,
        "mean_in_flight": mean_in_flight(run.records, window["t0"], window["t1"], now),
        "mean_stream_ms": mean_ms(lengths),
        "ttft_p50_ms": pct_ms(ttft, 0.50),
        "ttft_p99_ms": pct_ms(ttft, 0.99),
        "late_p99_ms": pct_ms(late, 0.99),
        "late_max_ms": late[-1] * 1000 if late else NAN,
        "events_per_s": window["events"] / secs,
        "proxy_cpu_s": cpu,
        "events_per_cpu_s": window["events"] / cpu if cpu > 0 else NAN,
        "client_cpu_s": window["client_cpu"],
        "upstream_cpu_s": window["upstream_cpu"],
        "other_cpu_s": window["other_cpu"],  # anything else busy on the machine (kernel threads too)
    }


_SUMMED = (
    "requests",
    "done",
    "failed",
    "unfinished",
    "connects",
    "stale",
    "proxy_cpu_s",
    "window_s",
    "client_cpu_s",
    "upstream_cpu_s",
    "other_cpu_s",
)


def merge(rows: list[dict]) -> dict:
    """One row from several rounds of the same (target, streams): pooled samples, summed counts."""
    ttft = sorted(x for r in rows for x in r["ttft"])
    late = sorted(x for r in rows for x in r["lateness"])
    lengths = [x for r in rows for x in r["durations"]]
    out: dict = {k: rows[0][k] for k in ("target", "streams")}
    for k in _SUMMED:
        out[k] = sum(r[k] for r in rows)
    out["ttft_p50_ms"], out["ttft_p99_ms"] = pct_ms(ttft, 0.50), pct_ms(ttft, 0.99)
    out["late_p99_ms"], out["late_max_ms"] = pct_ms(late, 0.99), (late[-1] * 1000 if late else NAN)
    out["mean_stream_ms"] = mean_ms(lengths)
    for k in ("events_per_s", "mean_in_flight"):
        out[k] = sum(r[k] * r["window_s"] for r in rows) / out["window_s"]
    out["events_per_cpu_s"] = sum(r["events_per_cpu_s"] * r["proxy_cpu_s"] for r in rows) / max(
        out["proxy_cpu_s"], 1e-9
    )
    return out


def _client(target: Target, body: bytes, keepalive: bool) -> tuple[StreamClient, bytes]:
    """A client for `target` that reads no payload (the upstream sends only content events), its request."""
    request = request_bytes("127.0.0.1", target.port, PATH, body, key=target.key, keepalive=keepalive)
    return StreamClient("127.0.0.1", target.port, keepalive=keepalive, parse=False, tls=target.tls), request


async def open_row(
    target: Target,
    streams: int,
    body: bytes,
    starts: list[float],
    duration: float,
    warmup: float,
    cfg: OverheadConfig,
) -> dict:
    """An open-loop run through `target` (a stream at each of `starts`), as a row."""
    client, request = _client(target, body, cfg.keepalive)
    run = await run_open(client, request, starts, duration, warmup, cfg.drain, target.cpu_counters)
    return summarise(target, streams, run)


async def closed_row(
    target: Target, streams: int, duration: float, warmup: float, body: bytes, keepalive: bool, stagger: float
) -> dict:
    """A closed-loop run through `target`: `streams` workers starting within [0, stagger), as a row.

    The offsets are seeded by `streams` (the same for every target); only streams started once every
    worker has started are measured.
    """
    client, request = _client(target, body, keepalive)
    offsets = stagger_offsets(streams, stagger, seed=streams)
    run = await run_closed(client, request, offsets, duration, max(warmup, stagger), target.cpu_counters)
    return summarise(target, streams, run)


async def mean_stream_s(direct: Target, streams: int, body: bytes, cfg: OverheadConfig) -> float:
    """Mean stream length measured on `direct`: a pilot open-loop run at the nominal rate.

    Nominal = first_ms + tokens * gap_ms; the real length is longer by the connect, the request
    handling and the upstream timers' slip (each of the `tokens` gaps is a separate ms-rounded timer).
    """
    nominal = (cfg.first_ms + cfg.tokens * cfg.gap_ms) / 1000
    starts = poisson_starts(streams / nominal, nominal, cfg.seed - 1)
    row = await open_row(direct, streams, body, starts, nominal, 0.0, cfg)
    if not row["durations"]:
        raise RuntimeError(f"pilot run on direct finished no stream (failed={row['failed']})")
    return row["mean_stream_ms"] / 1000


async def run_latency(
    targets: list[Target], streams: int, body: bytes, cfg: OverheadConfig, stream_ms: dict
) -> list[dict]:
    """One concurrency level: targets interleaved, `rounds` times, samples pooled per target.

    Poisson arrivals: the rate is streams / mean stream length (Little's law), recorded in `stream_ms`.
    """
    per_round = cfg.duration / cfg.rounds
    rows: dict[str, list[dict]] = {t.name: [] for t in targets}
    if cfg.arrivals == "poisson":
        if cfg.stream_ms:
            mean_s, how = cfg.stream_ms / 1000, "given by --stream-ms"
        else:
            mean_s, how = await mean_stream_s(targets[0], streams, body, cfg), "measured on direct"
        stream_ms[streams] = (mean_s * 1000, how)
        warmup = max(cfg.warmup, mean_s)  # in flight reaches its steady level after one stream length
        for r in range(cfg.rounds):
            starts = poisson_starts(
                streams / mean_s, warmup + per_round, cfg.seed * 1_000_003 + streams * 101 + r
            )
            for t in targets:
                rows[t.name].append(await open_row(t, streams, body, starts, per_round, warmup, cfg))
    else:
        # one stream's length: staggered starts spread over it keep arrivals spread in the closed loop
        stagger = (cfg.first_ms + cfg.tokens * cfg.gap_ms) / 1000 if cfg.arrivals == "staggered" else 0.0
        for _ in range(cfg.rounds):
            for t in targets:
                rows[t.name].append(
                    await closed_row(t, streams, per_round, cfg.warmup, body, cfg.keepalive, stagger)
                )
    out = []
    for t in targets:
        row = merge(rows[t.name])
        print(
            f"latency {t.name:8s} streams={streams:4d} p50={row['ttft_p50_ms']:.2f} "
            f"p99={row['ttft_p99_ms']:.2f} ms requests={row['requests']} failed={row['failed']} "
            f"in-flight={row['mean_in_flight']:.1f} connects={row['connects']} stale={row['stale']} "
            f"start-late p99/max={row['late_p99_ms']:.2f}/{row['late_max_ms']:.2f} ms",
            flush=True,
        )
        out.append(row)
    return out


async def run_all(
    targets: list[Target], cfg: OverheadConfig, spinner: subprocess.Popen | None
) -> tuple[list[dict], list[dict], dict[int, tuple[float, str]]]:
    """Latency runs per concurrency level (with the spinner, if any), then throughput runs (closed
    loop, all streams at once; the spinner stopped first)."""
    latency: list[dict] = []
    stream_ms: dict[int, tuple[float, str]] = {}
    body = paced_body(cfg.tokens, cfg.first_ms, cfg.gap_ms)
    for streams in cfg.concurrency:
        latency += await run_latency(targets, streams, body, cfg, stream_ms)
    if spinner is not None:
        spinner.kill()
        spinner.wait()
    throughput: list[dict] = []
    fast = paced_body(cfg.tp_tokens, 1, cfg.tp_gap_ms)
    for t in targets:
        row = merge(
            [await closed_row(t, cfg.tp_streams, cfg.tp_duration, cfg.warmup, fast, cfg.keepalive, 0.0)]
        )
        print(
            f"throughput {t.name:8s} events/s={row['events_per_s']:.0f} "
            f"events/cpu-s={row['events_per_cpu_s']:.0f} failed={row['failed']}",
            flush=True,
        )
        throughput.append(row)
    return latency, throughput, stream_ms
