"""The gateway-overhead runs and rows: hand-built rows merge as documented; a tiny run end to end."""

from __future__ import annotations

import asyncio
import math
import os

import pytest

from pdfleet.bench.client import Record, Stats
from pdfleet.bench.gateway_overhead import OverheadConfig, merge, run_all, summarise
from pdfleet.bench.load import LoadRun
from pdfleet.bench.proxies import Target
from tests.unit.bench.helpers import paced_upstream

NAN = float("nan")


def _window(t0: float, secs: float, events: float, proxy: float) -> tuple[dict, dict]:
    zero = {"t": t0, "events": 0.0, "done": 0.0, "proxy_cpu": 1.0, "upstream_cpu": 1.0}
    zero |= {"client_cpu": 1.0, "other_cpu": 1.0}
    end = {"t": t0 + secs, "events": events, "done": 3.0, "proxy_cpu": 1.0 + proxy, "upstream_cpu": 1.5}
    end |= {"client_cpu": 1.25, "other_cpu": 1.1}
    return zero, end


def test_summarise_turns_a_run_into_a_row() -> None:
    """Percentiles of the TTFTs, failures plus the abandoned, rates over the window, CPU over it."""
    stats = Stats(ttft=[0.030, 0.010, 0.020], done=3, events=999, failed=1, connects=2, stale=1)
    before, after = _window(100.0, 2.0, 400.0, 0.5)
    records = [Record(start=99.0, end=101.0), Record(start=100.5), Record(start=101.0, end=101.5)]
    run = LoadRun(stats, before, after, records, lateness=[0.002, 0.001], unfinished=1)
    row = summarise(Target("nginx", 1, None, [], []), 50, run)
    assert row["ttft"] == [0.010, 0.020, 0.030]
    assert (row["requests"], row["done"], row["failed"], row["unfinished"]) == (3, 3, 2, 1)
    assert (row["connects"], row["stale"], row["target"], row["streams"]) == (2, 1, "nginx", 50)
    # percentiles interpolate linearly between ranks, as numpy (and vllm bench serve) do
    assert row["ttft_p50_ms"] == pytest.approx(20.0) and row["ttft_p99_ms"] == pytest.approx(29.8)
    assert row["late_p99_ms"] == pytest.approx(1.99) and row["late_max_ms"] == pytest.approx(2.0)
    assert row["durations"] == [2.0, 0.5] and row["mean_stream_ms"] == pytest.approx(1250.0)
    assert row["events_per_s"] == pytest.approx(200.0) and row["events_per_cpu_s"] == pytest.approx(800.0)
    assert (row["window_s"], row["proxy_cpu_s"]) == pytest.approx((2.0, 0.5))
    assert (row["client_cpu_s"], row["upstream_cpu_s"], row["other_cpu_s"]) == pytest.approx((0.25, 0.5, 0.1))
    assert row["mean_in_flight"] > 0


def test_a_run_without_proxy_cpu_or_samples_still_makes_a_row() -> None:
    """No TTFT, no lateness, no proxy CPU: NaNs, not exceptions."""
    before, after = _window(0.0, 1.0, 10.0, 0.0)
    row = summarise(Target("direct", 1, None, [], []), 5, LoadRun(Stats(), before, after))
    assert math.isnan(row["ttft_p50_ms"]) and math.isnan(row["late_max_ms"])
    assert math.isnan(row["events_per_cpu_s"]) and math.isnan(row["mean_stream_ms"])


def test_merge_pools_samples_and_weights_rates_by_window() -> None:
    """Counts sum; percentiles over the pooled samples; rates weighted by window, per-CPU by CPU."""
    a = {"ttft": [0.010, 0.030], "lateness": [0.001], "durations": [1.0], "events_per_s": 100.0}
    a |= {"mean_in_flight": 10.0, "events_per_cpu_s": 1000.0, "proxy_cpu_s": 1.0, "window_s": 1.0}
    b = {"ttft": [0.020], "lateness": [0.004], "durations": [2.0, 3.0], "events_per_s": 400.0}
    b |= {"mean_in_flight": 40.0, "events_per_cpu_s": 4000.0, "proxy_cpu_s": 3.0, "window_s": 3.0}
    for row, n in ((a, 1), (b, 2)):
        row |= {"target": "gateway", "streams": 50, "requests": n, "done": n, "failed": 0, "unfinished": 0}
        row |= {"connects": n, "stale": 0, "client_cpu_s": 0.1, "upstream_cpu_s": 0.2, "other_cpu_s": 0.0}
    out = merge([a, b])
    assert (out["target"], out["streams"], out["requests"], out["connects"]) == ("gateway", 50, 3, 3)
    assert out["window_s"] == 4.0 and out["proxy_cpu_s"] == 4.0
    assert out["ttft_p50_ms"] == pytest.approx(20.0) and out["ttft_p99_ms"] == pytest.approx(29.8)
    assert out["late_p99_ms"] == pytest.approx(3.97) and out["late_max_ms"] == pytest.approx(4.0)
    assert out["mean_stream_ms"] == pytest.approx(2000.0)
    assert out["events_per_s"] == pytest.approx((100.0 + 1200.0) / 4.0)
    assert out["mean_in_flight"] == pytest.approx((10.0 + 120.0) / 4.0)
    assert out["events_per_cpu_s"] == pytest.approx((1000.0 + 12000.0) / 4.0)
    assert "ttft" not in out  # the raw samples stay behind


def _tiny(**kw: object) -> OverheadConfig:
    base = dict(concurrency=[3], duration=0.2, rounds=2, tp_duration=0.1, warmup=0.02, tokens=2)
    base |= dict(first_ms=1.0, gap_ms=1.0, tp_streams=3, tp_tokens=5, tp_gap_ms=1.0, drain=2.0)
    return OverheadConfig(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("arrivals", ["poisson", "burst", "staggered"])
def test_a_tiny_run_through_the_direct_target(arrivals: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Pilot (poisson), rounds, throughput: one latency and one throughput row, streams done, none failed."""

    async def main() -> tuple[list[dict], list[dict], dict]:
        async with paced_upstream() as port:
            me = [os.getpid()]
            direct = Target("direct", port, None, me, me, bench=me)
            return await run_all([direct], _tiny(arrivals=arrivals), None)

    latency, throughput, stream_ms = asyncio.run(main())
    assert [r["target"] for r in latency + throughput] == ["direct", "direct"]
    assert latency[0]["requests"] > 0 and latency[0]["failed"] == 0
    assert throughput[0]["done"] > 0 and throughput[0]["events_per_s"] > 0
    if arrivals == "poisson":
        assert stream_ms[3][1] == "measured on direct" and stream_ms[3][0] > 0
    else:
        assert stream_ms == {}
    out = capsys.readouterr().out
    assert "latency direct   streams=   3" in out and "throughput direct" in out


def test_a_given_stream_length_skips_the_pilot() -> None:
    """--stream-ms sets the rate; no pilot run."""

    async def main() -> dict:
        async with paced_upstream() as port:
            me = [os.getpid()]
            stream_ms: dict = {}
            direct = Target("direct", port, None, me, me, bench=me)
            _, _, stream_ms = await run_all([direct], _tiny(stream_ms=5.0), None)
            return stream_ms

    assert asyncio.run(main()) == {3: (5.0, "given by --stream-ms")}
