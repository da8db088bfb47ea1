"""The one rule for quantiles read from histograms: a figure inside the first bucket is only `<bound`,
two figures in one bucket cannot be ordered, an alert bound inside the first bucket is raised to it."""

from __future__ import annotations

import math

from pdfleet.metrics.bounds import (
    BUCKETS,
    Bucket,
    below_first,
    bucket_of,
    first_bound,
    judgeable,
    same_bucket,
    show_ms,
)
from pdfleet.metrics.source import bucket_quantile

QUEUE = BUCKETS["vllm:request_queue_time_seconds"]


def _quantile(q: float, bounds: tuple[float, ...], counts: list[int]) -> float:
    """histogram_quantile over per-bucket counts (the last one +Inf)."""
    cumulative, acc = [], 0
    for c in counts:
        acc += c
        cumulative.append(acc)
    return bucket_quantile(q, list(zip([*bounds, math.inf], cumulative, strict=True)))


def test_vllm_request_times_start_at_300_ms_and_interpolate_to_the_figures_monitor_printed() -> None:
    """The issue's figures: every request under 0.3 s reads 150 / 285 / 297 ms at P50 / P95 / P99."""
    assert first_bound("vllm:request_prefill_time_seconds") == 0.3 == QUEUE[0]
    counts = [40] + [0] * len(QUEUE)
    got = [round(1000 * _quantile(q, QUEUE, counts)) for q in (0.5, 0.95, 0.99)]
    assert got == [150, 285, 297]
    assert [show_ms(v, QUEUE) for v in got] == ["<300", "<300", "<300"]


def test_a_figure_past_the_first_bucket_is_shown_as_it_is() -> None:
    assert show_ms(300.0, QUEUE) == "300"  # the bound itself: every observation at or under it
    assert show_ms(412.4, QUEUE) == "412"
    assert show_ms(4.2, BUCKETS["vllm:nixl_xfer_time_seconds"]) == "<5"
    assert show_ms(7.25, BUCKETS["vllm:nixl_xfer_time_seconds"], digits=1) == "7.2"
    assert show_ms(150.0, ()) == "150"  # unknown bounds: nothing to say about it


def test_the_bucket_of_a_value_closes_at_its_le() -> None:
    assert bucket_of(0.1, QUEUE) == Bucket(0.0, 0.3) and bucket_of(0.1, QUEUE).first
    assert bucket_of(0.3, QUEUE) == Bucket(0.0, 0.3)
    assert bucket_of(0.31, QUEUE) == Bucket(0.3, 0.5) and not bucket_of(0.31, QUEUE).first
    assert bucket_of(1e9, QUEUE) == Bucket(QUEUE[-1], math.inf)
    assert below_first(0.299, QUEUE) and not below_first(0.3, QUEUE) and not below_first(0.1, ())


def test_two_figures_in_one_bucket_cannot_be_ordered() -> None:
    assert same_bucket(0.15, 0.285, QUEUE)
    assert not same_bucket(0.285, 0.35, QUEUE)
    assert same_bucket(0.31, 0.49, QUEUE)
    assert not same_bucket(0.1, 0.2, ())


def test_an_alert_bound_inside_the_first_bucket_is_raised_to_it() -> None:
    assert judgeable(0.2, QUEUE) == 0.3
    assert judgeable(0.5, QUEUE) == 0.5
    assert judgeable(0.2, ()) == 0.2


def test_every_histogram_the_readers_take_quantiles_of_has_its_bounds() -> None:
    from pdfleet.bench.server_side import CHAIN as BENCH_CHAIN
    from pdfleet.model.monitoring import _KV_SERIES
    from pdfleet.monitoring.recording import CHAIN

    kv = [histogram for histogram, _, _ in _KV_SERIES.values()]  # the bench's KV figure, per connector
    for name in [s.histogram for s in CHAIN] + [h for _, h in BENCH_CHAIN if h is not None] + kv:
        assert list(BUCKETS[name]) == sorted(BUCKETS[name]) and BUCKETS[name], name
