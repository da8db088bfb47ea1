"""The gateway-overhead report: exact table lines from hand-built rows, notes only when they apply."""

from __future__ import annotations

from pdfleet.bench.gateway_overhead import OverheadConfig
from pdfleet.bench.gateway_overhead_report import describe, fmt_latency, fmt_table, fmt_throughput, setup_line

NAN = float("nan")


def _row(target: str, streams: int = 50, **kw: float) -> dict:
    row = {
        "target": target,
        "streams": streams,
        "requests": 475,
        "failed": 0,
        "mean_in_flight": 49.04,
        "connects": 130,
        "ttft_p50_ms": 20.41,
        "ttft_p99_ms": 22.03,
        "late_p99_ms": 1.55,
        "late_max_ms": 13.0,
        "window_s": 8.0,
        "client_cpu_s": 0.4,
        "upstream_cpu_s": 0.4,
        "proxy_cpu_s": 0.8,
        "other_cpu_s": 0.0,
        "events_per_s": 40000.0,
        "events_per_cpu_s": 100000.0,
    }
    row.update(kw)
    return row


def test_latency_table_adds_each_proxys_ttft_over_direct_at_the_same_concurrency() -> None:
    """direct has no 'added' cells; a proxy's are its TTFT minus direct's, and its CPU % of the window."""
    lines = fmt_latency(
        [_row("direct"), _row("gateway", ttft_p50_ms=23.79, ttft_p99_ms=40.88, late_max_ms=NAN)]
    )
    assert lines[0].startswith("| streams | target | requests | failed | mean in-flight |")
    assert lines[1] == "|" + "---|" * 13
    assert (
        lines[2] == "| 50 | direct | 475 | 0 | 49.0 | 130 | 20.41 | 22.03 | - | - | - | 10 | 1.55 / 13.00 |"
    )
    assert (
        lines[3] == "| 50 | gateway | 475 | 0 | 49.0 | 130 | 23.79 | 40.88 | +3.38 | +18.85 | 10 | 10 | - |"
    )


def test_throughput_table_compares_the_gateway_with_nginx() -> None:
    """Only the gateway's row gets the 'vs nginx' ratios; without nginx, nobody does."""
    rows = [
        _row("nginx", 200, events_per_s=80000.0, events_per_cpu_s=280000.0, proxy_cpu_s=2.28),
        _row("gateway", 200, events_per_s=72000.0, events_per_cpu_s=168000.0, proxy_cpu_s=3.41),
    ]
    lines = fmt_throughput(rows)
    assert lines[2] == "| nginx | 200 | 80000 | 2.28 | 280000 | - |"
    assert lines[3] == "| gateway | 200 | 72000 | 3.41 | 168000 | 90% delivered, 60% per CPU-s |"
    assert fmt_throughput(rows[1:])[2].endswith("| - |")


def test_fmt_table_has_no_notes_on_a_quiet_run() -> None:
    """Both tables, a blank line between, nothing else."""
    text = fmt_table([_row("direct")], [_row("direct", 200)])
    assert "note:" not in text
    assert text.count("\n\n") == 1


def test_fmt_table_notes_a_late_client_and_a_busy_machine() -> None:
    """Start lateness p99 over 5 ms, or other processes over 10% of a CPU: a note naming those rows."""
    latency = [_row("direct", 500, late_p99_ms=5.3), _row("nginx", 500, late_p99_ms=4.9)]
    throughput = [_row("gateway", 200, other_cpu_s=1.04)]
    text = fmt_table(latency, throughput)
    assert "note: the load client started streams late (timer granularity alone is ~1 ms): " in text
    assert "direct at 500 streams: p99 5.3 ms." in text and "nginx at 500 streams: p99" not in text
    assert "note: other processes kept the machine busy during some measured windows (% of one CPU): " in text
    assert "gateway at 200 streams: 13%. Those rows may be disturbed; rerun on a quiet machine." in text


def test_describe_states_the_arrivals_and_the_connections() -> None:
    """Poisson lists each level's start rate and how the mean stream length was found."""
    cfg = OverheadConfig(concurrency=[50], seed=3)
    lines = describe(cfg, {50: (1638.0, "measured on direct")})
    assert lines[0].endswith(
        "seed 3): 50 streams: 30.5 starts/s = 50 / 1638 ms mean stream (measured on direct)"
    )
    assert lines[1].startswith("connections: keepalive (client pool")
    burst = describe(OverheadConfig(concurrency=[50], arrivals="burst", connections="close"), {})
    assert burst == [
        "arrivals: burst (closed loop, stress mode: all streams start together and stay in phase)",
        "connections: close (a new TCP connection per stream, `Connection: close`)",
    ]


def test_setup_line_says_whether_the_proxies_core_was_kept_awake() -> None:
    """The pinning, the stream's shape and the spinner."""
    cfg = OverheadConfig(concurrency=[50])
    awake = setup_line(cfg, (0, 1), kept_awake=True)
    assert awake.startswith("cpu pinning: proxies on CPU 1, upstream + client on CPU 0; 64 events/stream,")
    assert awake.endswith("(SCHED_IDLE spinner on CPU 1)")
    assert setup_line(cfg, (None, None), kept_awake=False).endswith("not kept awake (--no-keep-awake)")
