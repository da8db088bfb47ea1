"""The gateway-overhead benchmark's report: what was run, the latency and throughput tables, and notes."""

from __future__ import annotations

import math

from pdfleet.bench.gateway_overhead import OverheadConfig
from pdfleet.bench.report import markdown_table, note

LATE_NOTE_MS = 5.0  # start lateness p99 above which the table gets a note
BUSY_NOTE = 0.1  # CPU used by other processes (share of one CPU) above which a row gets a note

LATENCY_HEADER = (
    "streams", "target", "requests", "failed", "mean in-flight", "connects", "TTFT p50 ms", "TTFT p99 ms",
    "added p50 ms", "added p99 ms", "proxy CPU %", "CPU 0 % (client+upstream)", "start late p99 / max ms",
)  # fmt: skip
THROUGHPUT_HEADER = (
    "target", "streams", "events/s delivered", "proxy CPU s", "events per proxy CPU-s", "vs nginx",
)  # fmt: skip


def setup_line(cfg: OverheadConfig, cpus: tuple[int | None, int | None], kept_awake: bool) -> str:
    """Where everything ran, what a latency stream is, and whether the proxies' core was kept awake."""
    return (
        f"cpu pinning: proxies on CPU {cpus[1]}, upstream + client on CPU {cpus[0]}; "
        f"{cfg.tokens} events/stream, first event after {cfg.first_ms} ms, then every {cfg.gap_ms} ms; "
        + (
            f"proxies' core kept awake during the latency runs (SCHED_IDLE spinner on CPU {cpus[1]})"
            if kept_awake
            else "proxies' core not kept awake (--no-keep-awake)"
        )
    )


def describe(cfg: OverheadConfig, stream_ms: dict[int, tuple[float, str]]) -> list[str]:
    """Lines stating the arrival model and connection mode of the latency table."""
    if cfg.arrivals == "poisson":
        rates = "; ".join(
            f"{n} streams: {n / (ms / 1000):.1f} starts/s = {n} / {ms:.0f} ms mean stream ({how})"
            for n, (ms, how) in stream_ms.items()
        )
        arrivals = (
            "poisson (open loop: stream starts are a seeded Poisson process, the same for every target; "
            f"rate = streams / mean stream length, Little's law; seed {cfg.seed}): {rates}"
        )
    elif cfg.arrivals == "burst":
        arrivals = "burst (closed loop, stress mode: all streams start together and stay in phase)"
    else:
        arrivals = "staggered (closed loop, periodic: each worker keeps a fixed random phase)"
    conns = (
        "keepalive (client pool: a stream reuses an idle connection, opens one only when none is idle)"
        if cfg.keepalive
        else "close (a new TCP connection per stream, `Connection: close`)"
    )
    return [f"arrivals: {arrivals}", f"connections: {conns}"]


def _latency_cells(row: dict, base: dict) -> list[str]:
    secs = row["window_s"]
    cpu0 = 100 * (row["client_cpu_s"] + row["upstream_cpu_s"]) / secs
    late = (
        f"{row['late_p99_ms']:.2f} / {row['late_max_ms']:.2f}" if not math.isnan(row["late_max_ms"]) else "-"
    )
    if row["target"] != "direct":
        added = [
            f"{row['ttft_p50_ms'] - base['ttft_p50_ms']:+.2f}",
            f"{row['ttft_p99_ms'] - base['ttft_p99_ms']:+.2f}",
            f"{100 * row['proxy_cpu_s'] / secs:.0f}",
        ]
    else:
        added = ["-", "-", "-"]
    return [
        str(row["streams"]), row["target"], str(row["requests"]), str(row["failed"]),
        f"{row['mean_in_flight']:.1f}", str(row["connects"]),
        f"{row['ttft_p50_ms']:.2f}", f"{row['ttft_p99_ms']:.2f}", *added, f"{cpu0:.0f}", late,
    ]  # fmt: skip


def fmt_latency(latency: list[dict]) -> list[str]:
    """The latency table: TTFT through each target, what the proxies add, and what the bench cost."""
    cells = []
    for row in latency:
        base = next(r for r in latency if r["streams"] == row["streams"] and r["target"] == "direct")
        cells.append(_latency_cells(row, base))
    return markdown_table(LATENCY_HEADER, cells)


def fmt_throughput(throughput: list[dict]) -> list[str]:
    """The throughput table: events delivered per second and per proxy CPU-second, the gateway vs nginx."""
    ng = next((r for r in throughput if r["target"] == "nginx"), None)
    cells = []
    for row in throughput:
        rel = (
            f"{100 * row['events_per_s'] / ng['events_per_s']:.0f}% delivered, "
            f"{100 * row['events_per_cpu_s'] / ng['events_per_cpu_s']:.0f}% per CPU-s"
            if ng and row["target"] == "gateway"
            else "-"
        )
        cells.append(
            [
                row["target"], row["streams"], f"{row['events_per_s']:.0f}", f"{row['proxy_cpu_s']:.2f}",
                f"{row['events_per_cpu_s']:.0f}", rel,
            ]
        )  # fmt: skip
    return markdown_table(THROUGHPUT_HEADER, cells)


def fmt_table(latency: list[dict], throughput: list[dict]) -> str:
    """The markdown tables for the report, with notes on rows the client or other processes may skew."""
    late = [
        f"{r['target']} at {r['streams']} streams: p99 {r['late_p99_ms']:.1f} ms"
        for r in latency
        if r["late_p99_ms"] > LATE_NOTE_MS
    ]
    busy = [
        f"{r['target']} at {r['streams']} streams: {100 * r['other_cpu_s'] / r['window_s']:.0f}%"
        for r in latency + throughput
        if r["other_cpu_s"] > BUSY_NOTE * r["window_s"]
    ]
    out = [
        *fmt_latency(latency),
        "",
        *fmt_throughput(throughput),
        *note(
            "the load client started streams late (timer granularity alone is ~1 ms): ",
            late,
            ". There the client (CPU 0), not the proxy, may be what limits the load.",
        ),
        *note(
            "other processes kept the machine busy during some measured windows (% of one CPU): ",
            busy,
            ". Those rows may be disturbed; rerun on a quiet machine.",
        ),
    ]
    return "\n".join(out)
