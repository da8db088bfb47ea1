"""Statistics from hand-built timings: percentiles, means, streams in flight, inter-token gaps, histogram
bounds; and vLLM bench serve's figures: TTFT, TPOT from usage, pooled ITL, E2E, percentiles, goodput,
attainment (failures count bad), stalls per 100 streams, peaks, per GPU, and vLLM's key names."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdfleet.bench.client import Record
from pdfleet.bench.stats import (
    PERCENTILES,
    VLLM_RESULT_KEYS,
    Bounds,
    distribution,
    durations,
    gaps,
    good,
    histogram_bound,
    itl,
    itl_within,
    mean_in_flight,
    mean_ms,
    output_len,
    pct_key,
    pct_ms,
    per_gpu,
    summarize,
    tpot,
)

NAN = float("nan")
FIVE = [0.001, 0.002, 0.003, 0.004, 0.005]  # seconds, sorted


def _span(start: float, end: float) -> Record:
    """A record that began and ended (NaN: never) at these times."""
    return Record(start=start, end=end)


@pytest.mark.parametrize(
    ("xs", "q", "ms"),
    [
        (FIVE, 0.0, 1.0),
        (FIVE, 0.25, 2.0),  # rank 0.25 * 4 = 1: an element
        (FIVE, 0.5, 3.0),  # rank 2
        (FIVE, 0.99, 4.96),  # rank 3.96: 4 + 0.96 * (5 - 4)
        (FIVE, 1.0, 5.0),
        ([0.010, 0.020, 0.030, 0.040], 0.5, 25.0),  # rank 1.5: halfway between 20 and 30
        ([0.010, 0.020, 0.030, 0.040], 0.3, 19.0),  # rank 0.9: 10 + 0.9 * 10
        ([0.010, 0.020, 0.030, 0.040], 0.999, 39.97),  # rank 2.997
        ([0.007], 0.99, 7.0),
    ],
)
def test_pct_ms_interpolates_linearly_between_ranks(xs: list[float], q: float, ms: float) -> None:
    """The q-quantile at rank q * (n - 1), linear between the neighbours (numpy's default), in ms."""
    assert pct_ms(xs, q) == pytest.approx(ms)


@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0])
@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000])
def test_pct_ms_is_what_vllm_bench_serve_gets_from_numpy(n: int, q: float) -> None:
    """vllm bench serve: np.percentile(ttfts, p); the same number here for any sample and percentile."""
    xs = sorted((i * 7919 % 1009) / 1e4 for i in range(n))
    assert pct_ms(xs, q) == pytest.approx(float(np.percentile(np.array(xs), 100 * q)) * 1000)


def test_empty_samples_give_nan() -> None:
    """No samples: NaN, never an exception (a row with no requests still prints)."""
    assert math.isnan(pct_ms([], 0.5))
    assert math.isnan(mean_ms([]))


def test_mean_ms() -> None:
    """The mean of seconds, in ms."""
    assert mean_ms([0.010, 0.020, 0.060]) == pytest.approx(30.0)


def test_durations_leave_out_streams_not_started_or_not_ended() -> None:
    """Only finished streams have a length."""
    spans = [_span(1.0, 1.5), _span(2.0, NAN), _span(NAN, NAN), _span(3.0, 5.0)]
    assert durations(spans) == [0.5, 2.0]


def test_mean_in_flight_is_the_time_average_over_the_window() -> None:
    """Over [1, 3]: one stream 1 s in the window, one still running until now=2.5, one outside."""
    spans = [_span(0.0, 2.0), _span(1.0, NAN), _span(NAN, NAN), _span(3.0, 4.0)]
    assert mean_in_flight(spans, 1.0, 3.0, now=2.5) == pytest.approx((1.0 + 1.5 + 0.0) / 2.0)


def test_itl_is_every_gap_between_consecutive_chunks() -> None:
    """vLLM bench's ITL: chunk-to-chunk gaps (a zero gap for chunks read together)."""
    assert itl([10.0, 10.1, 10.3, 10.3]) == pytest.approx([0.1, 0.2, 0.0])
    assert itl([10.0]) == [] and itl([]) == []


def test_itl_within_keeps_the_gaps_whose_both_chunks_are_in_the_window() -> None:
    """A gap straddling the window's edge is not the window's."""
    times = [1.0, 2.0, 2.5, 4.0, 4.2]
    assert itl_within(times, 2.0, 4.0) == pytest.approx([0.5, 1.5])
    assert itl_within(times, 4.5, 9.0) == []


def test_histogram_bound_is_the_smallest_bucket_holding_every_new_observation() -> None:
    """4 new observations: 2 within 10 ms, all 4 within 25 ms."""
    before = {0.01: 5.0, 0.025: 8.0, 0.1: 10.0, math.inf: 10.0}
    after = {0.01: 7.0, 0.025: 12.0, 0.1: 14.0, math.inf: 14.0}
    assert histogram_bound(before, after) == 0.025


def test_histogram_bound_beyond_every_finite_bucket_is_inf() -> None:
    """An observation only +Inf holds."""
    assert histogram_bound({0.01: 0.0, math.inf: 0.0}, {0.01: 1.0, math.inf: 2.0}) == math.inf


def test_histogram_bound_with_nothing_new_is_the_smallest_bound() -> None:
    """Nothing observed in between: every bucket holds all zero new observations."""
    same = {0.01: 3.0, 0.025: 3.0, math.inf: 3.0}
    assert histogram_bound(same, same) == 0.01


# `vllm bench serve --save-result` keys (vllm/benchmarks/serve.py: results, then ttft/tpot/itl/e2el figures)
VLLM_KEYS = {
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std")),
    *(f"p{p}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for p in ("50", "90", "95", "99", "99.9")),
}


def rec(
    start: float,
    chunks: list[float],
    n: int | None,
    error: str = "",
    cls: str = "short",
    prompt: int = 100,
    index: int = 0,
) -> Record:
    """A request that started at `start` and got content events at `chunks` (perf_counter s)."""
    r = Record(
        index,
        "colocated",
        cls,
        prompt,
        8,
        start=start,
        chunks=list(chunks),
        output_tokens=n,
        error=error,
        status=200 if not error else 500,
    )
    if chunks:
        r.ttft = chunks[0] - start
    return r


A = rec(0.0, [0.100, 0.110, 0.130, 0.160], 4)  # TTFT 100 ms, gaps 10/20/30, E2E 160 ms, TPOT 20 ms
B = rec(0.5, [0.700, 1.400], 2, index=1)  # TTFT 200 ms, one gap of 700 ms (a stall), TPOT 700 ms
FAILED = rec(1.0, [1.1], None, error="HTTP 500: boom", index=2)


def test_one_request_ttft_tpot_itl_e2e() -> None:
    assert A.ttft == pytest.approx(0.100) and A.latency == pytest.approx(0.160)
    assert gaps(A) == pytest.approx([0.010, 0.020, 0.030])
    assert tpot(A) == pytest.approx((0.160 - 0.100) / 3)  # (E2E - TTFT) / (n - 1), n from usage


def test_tpot_uses_usage_not_the_number_of_events() -> None:
    """Two events carrying 9 tokens (usage says 9): TPOT divides by 8, not by 1."""
    r = rec(0.0, [0.1, 0.5], 9)
    assert tpot(r) == pytest.approx(0.4 / 8) and output_len(r) == 9
    assert output_len(rec(0.0, [0.1, 0.2, 0.3], None)) == 3  # no usage event: count the events


def test_tpot_of_a_single_token_is_left_out_but_counts_zero_for_goodput() -> None:
    one = rec(0.0, [0.05], 1)
    assert tpot(one) is None
    assert good(one, Bounds(ttft_ms=100, tpot_ms=1))
    s = summarize([one], 1.0, Bounds(100, 1))
    assert math.isnan(s["mean_tpot_ms"]) and s["request_goodput"] == 1.0


def test_summary_pools_itl_over_requests_and_weights_tpot_per_request() -> None:
    s = summarize([A, B], 2.0, Bounds(ttft_ms=150, tpot_ms=100, stall_ms=500))
    assert s["completed"] == 2 and s["failed"] == 0
    assert s["mean_ttft_ms"] == pytest.approx(150.0)
    assert s["median_ttft_ms"] == pytest.approx(150.0)  # linear between 100 and 200
    assert s["p99_ttft_ms"] == pytest.approx(100 + 0.99 * 100)
    assert s["mean_itl_ms"] == pytest.approx((10 + 20 + 30 + 700) / 4)  # pooled: every gap weighs the same
    assert s["p50_itl_ms"] == pytest.approx(25.0)
    assert s["mean_tpot_ms"] == pytest.approx((20 + 700) / 2)  # per request
    assert s["mean_e2el_ms"] == pytest.approx((160 + 900) / 2)
    assert s["std_ttft_ms"] == pytest.approx(50.0)  # np.std: population
    assert s["total_output_tokens"] == 6 and s["total_input_tokens"] == 200
    assert s["request_throughput"] == pytest.approx(1.0) and s["output_throughput"] == pytest.approx(3.0)
    assert s["total_token_throughput"] == pytest.approx(103.0)
    assert s["request_goodput"] == pytest.approx(0.5) and s["slo_attainment_pct"] == pytest.approx(50.0)
    assert s["stalls"] == 1 and s["stalls_per_100_streams"] == pytest.approx(50.0)
    assert s["streams_with_stall_pct"] == pytest.approx(50.0)


def test_percentiles_are_numpy_linear_for_every_reported_percentile() -> None:
    xs = [0.013, 0.002, 0.051, 0.007, 0.030, 0.011, 0.009]
    d = distribution("itl", xs)
    for p in PERCENTILES:
        assert d[pct_key("itl", p)] == pytest.approx(1000 * float(np.percentile(xs, p)))
    assert d["median_itl_ms"] == pytest.approx(1000 * float(np.median(xs)))
    assert d["std_itl_ms"] == pytest.approx(1000 * float(np.std(xs)))


def test_a_failed_request_is_counted_and_is_bad_for_attainment() -> None:
    s = summarize([A, B, FAILED], 2.0, Bounds(ttft_ms=1000, tpot_ms=1000))
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["slo_attainment_pct"] == pytest.approx(200 / 3)  # 2 good of 3: the failed one counts as bad
    assert s["mean_ttft_ms"] == pytest.approx(150.0)  # its partial timings stay out of the figures


def test_cancelled_requests_are_left_out() -> None:
    stopped = rec(1.0, [1.1], None, index=3)
    stopped.cancelled, stopped.error = True, "interrupted (Ctrl-C)"
    s = summarize([A, stopped], 1.0, Bounds(1000, 1000))
    assert (s["completed"], s["failed"]) == (1, 0)


def test_peak_output_tokens_per_second_and_requests_in_flight() -> None:
    s = summarize([A, B], 2.0, Bounds(1000, 1000))
    assert s["max_output_tokens_per_s"] == 5  # A's 4 events and B's first all in the first second
    assert s["max_concurrent_requests"] == 1  # A ended (0.16 s) before B started (0.5 s)
    c = rec(0.05, [0.12, 0.2], 2, index=4)
    assert summarize([A, c], 1.0, Bounds(1000, 1000))["max_concurrent_requests"] == 2


def test_time_scale_divides_every_time() -> None:
    """Time scale 2: wall times are twice the simulated ones; the figures reported are simulated."""
    s = summarize([A], 2.0, Bounds(1000, 1000), scale=2.0)
    assert s["mean_ttft_ms"] == pytest.approx(50.0) and s["duration"] == pytest.approx(1.0)
    assert s["mean_itl_ms"] == pytest.approx(10.0)


def test_empty_run_gives_nan_not_an_exception() -> None:
    s = summarize([], 1.0, Bounds(1, 1))
    assert s["completed"] == 0 and math.isnan(s["p99_ttft_ms"]) and math.isnan(s["stalls_per_100_streams"])


def test_keys_are_vllm_bench_serves() -> None:
    s = summarize([A, B], 2.0, Bounds(1000, 1000))
    assert set(s) >= VLLM_KEYS, VLLM_KEYS - set(s)
    assert set(VLLM_RESULT_KEYS) <= VLLM_KEYS
    assert pct_key("ttft", 99) == "p99_ttft_ms" and pct_key("itl", 99.9) == "p99.9_itl_ms"


def test_per_gpu_divides_the_rates() -> None:
    s = summarize([A, B], 2.0, Bounds(150, 100))
    g = per_gpu(s, 2)
    assert g["request_throughput_per_gpu"] == pytest.approx(0.5)
    assert g["request_goodput_per_gpu"] == pytest.approx(0.25)
