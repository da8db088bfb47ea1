"""Percentiles, means, streams in flight, inter-token gaps and histogram bounds from hand-built timings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pdfleet.bench.client import Span
from pdfleet.bench.stats import durations, histogram_bound, itl, itl_within, mean_in_flight, mean_ms, pct_ms

NAN = float("nan")
FIVE = [0.001, 0.002, 0.003, 0.004, 0.005]  # seconds, sorted


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
    spans = [Span(1.0, 1.5), Span(2.0, NAN), Span(NAN, NAN), Span(3.0, 5.0)]
    assert durations(spans) == [0.5, 2.0]


def test_mean_in_flight_is_the_time_average_over_the_window() -> None:
    """Over [1, 3]: one stream 1 s in the window, one still running until now=2.5, one outside."""
    spans = [Span(0.0, 2.0), Span(1.0, NAN), Span(NAN, NAN), Span(3.0, 4.0)]
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
