"""The direct /metrics scrape: samples summed over label sets; one histogram's buckets by bound."""

from __future__ import annotations

import math

from pdfleet.metrics.scrape import scrape_histogram, scrape_metrics
from tests.unit.bench.helpers import text_server

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
pdfleet_sim_steps 120.0

# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 5.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 8.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 9.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.01",model_name="m"} 1.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.025",model_name="m"} 1.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 9.0
vllm:time_to_first_token_seconds_bucket{le="0.01",model_name="m"} 7.0
"""


def test_scrape_metrics_sums_each_name_over_its_label_sets() -> None:
    """Comments and blank lines skipped; a name with two label sets is their sum."""
    with text_server({"/metrics": METRICS}) as url:
        out = scrape_metrics(url)
    assert out["vllm:num_requests_running"] == 7.0
    assert out["pdfleet_sim_steps"] == 120.0
    assert out["vllm:inter_token_latency_seconds_bucket"] == 26.0


def test_scrape_histogram_maps_each_bound_to_its_cumulative_count() -> None:
    """Only that histogram's buckets, +Inf included, summed over the other labels."""
    with text_server({"/metrics": METRICS}) as url:
        out = scrape_histogram(url, "vllm:inter_token_latency_seconds")
    assert out == {0.01: 6.0, 0.025: 9.0, math.inf: 11.0}
