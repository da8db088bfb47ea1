"""The Prometheus client against a real Prometheus scraping an exporter whose numbers the test sets."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import Counter, Gauge, Histogram

from pdfleet.bench.procs import free_port
from pdfleet.metrics.direct import DirectScrape, Scrape, Target
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.metrics.source import MetricsUnavailable, QueryError, SeriesAbsent, bucket_quantile
from tests.unit.metrics.helpers import exporter, prometheus, samples_seen, scrape_config, wait_for

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0)
TTFT = [0.02] * 50 + [0.2] * 40 + [0.8] * 10  # P50 in (0.01, 0.05], P95 in (0.5, 1.0]
LABELS = {"pool": "disagg", "role": "decode", "host": "h1"}


@dataclass
class World:
    client: PrometheusClient
    target: Target
    baseline: Scrape  # a direct scrape from before the observations

    @property
    def direct(self) -> DirectScrape:
        """A direct reader whose only earlier scrape is the baseline (tests run in any order)."""
        reader = DirectScrape([self.target])
        reader.history = [self.baseline]
        return reader


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """One exporter (a histogram, a counter, a gauge), scraped by Prometheus every second and directly."""
    with exporter() as exp:
        hist = Histogram(
            "vllm:time_to_first_token_seconds", "ttft", ["model_name"], buckets=BUCKETS, registry=exp.registry
        )
        counter = Counter("vllm:num_preemptions", "preemptions", ["model_name"], registry=exp.registry)
        gauge = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=exp.registry)
        Histogram("vllm:nixl_xfer_time_seconds", "never observed", buckets=BUCKETS, registry=exp.registry)
        child = hist.labels("m")
        counter.labels("m")
        gauge.labels("m").set(7)
        config = scrape_config([(f"127.0.0.1:{exp.port}", LABELS)])
        with prometheus(tmp_path_factory.mktemp("prom"), config) as prom:
            client = prom.client
            target = Target(exp.url, LABELS)
            # two scrapes of the empty histogram first, so the observations fall inside rate()'s window
            wait_for(samples_seen(client, "vllm:time_to_first_token_seconds_count", 2), what="two scrapes")
            baseline = DirectScrape([target]).scrape()
            for value in TTFT:
                child.observe(value)
            counter.labels("m").inc(30)
            wait_for(
                lambda: [s.value for s in client.instant("vllm:num_preemptions_total")] == [30.0],
                what="the observations scraped",
            )
            time.sleep(1.5)  # the direct baseline is at least 1 s old
            yield World(client, target, baseline)


def _expected(q: float) -> float:
    cumulative, acc = [], 0
    for bound in (*BUCKETS, math.inf):
        acc = sum(1 for v in TTFT if v <= bound)
        cumulative.append((bound, float(acc)))
    return bucket_quantile(q, cumulative)


def test_quantile_over_a_window_per_pool(world: World) -> None:
    for q in (0.5, 0.95, 0.99):
        got = world.client.quantile(q, "vllm:time_to_first_token_seconds", 60, by=("pool", "role"))
        assert list(got) == [("disagg", "decode")]
        assert got[("disagg", "decode")] == pytest.approx(_expected(q), rel=1e-6)
    assert 0.5 < _expected(0.95) <= 1.0 and 0.01 < _expected(0.5) <= 0.05


def test_direct_scrape_gives_the_same_quantile_count_and_gauge(world: World) -> None:
    """The same interface over a direct scrape: the same numbers as Prometheus for the same data."""
    for q in (0.5, 0.95):
        direct = world.direct.quantile(q, "vllm:time_to_first_token_seconds", 1, by=("pool",))
        prom = world.client.quantile(q, "vllm:time_to_first_token_seconds", 60, by=("pool",))
        assert direct == pytest.approx(prom)
    assert world.direct.increase("vllm:num_preemptions_total", 1, by=("host",)) == {("h1",): 30.0}
    assert world.direct.value("vllm:num_requests_waiting", by=("role",)) == {("decode",): 7.0}
    rate = world.direct.rate("vllm:num_preemptions_total", 1)[()]
    assert 0 < rate < 30


def test_counts_rates_and_gauges(world: World) -> None:
    at = time.time()
    grown = world.client.increase("vllm:num_preemptions_total", 60, by=("pool",), at=at)[("disagg",)]
    assert 25 <= grown <= 60  # Prometheus extrapolates to the window's edges, never below the truth much
    rate = world.client.rate("vllm:num_preemptions_total", 60, at=at)[()]
    assert rate == pytest.approx(grown / 60, rel=1e-6)
    assert world.client.value("vllm:num_requests_waiting", by=("host",), match={"role": "decode"}) == {
        ("h1",): 7.0
    }


def test_instant_and_range_queries(world: World) -> None:
    samples = world.client.instant('vllm:num_requests_waiting{role="decode"}')
    assert [(s.labels["host"], s.labels["job"], s.value) for s in samples] == [("h1", "test", 7.0)]
    now = time.time()
    series = world.client.range("vllm:num_requests_waiting", now - 5, now, 1)
    assert len(series) == 1 and len(series[0].points) >= 3
    assert {v for _, v in series[0].points} == {7.0}


def test_absent_series_is_an_error_not_a_zero(world: World) -> None:
    with pytest.raises(SeriesAbsent, match="vllm:kv_transfer_time_seconds_bucket"):
        world.client.quantile(0.95, "vllm:kv_transfer_time_seconds", 60)
    with pytest.raises(SeriesAbsent, match="no series"):
        world.client.value("vllm:num_requests_waiting", match={"pool": "colocated"})
    with pytest.raises(SeriesAbsent, match=r"vllm:num_preemptions_total\{pool=\"nope\"\}"):
        world.client.rate("vllm:num_preemptions_total", 60, match={"pool": "nope"})
    with pytest.raises(SeriesAbsent, match="no target exports"):
        world.direct.value("vllm:prefill_queue_time_seconds")


def test_a_histogram_without_observations_has_no_quantile(world: World) -> None:
    with pytest.raises(SeriesAbsent, match="no observation in the last 60 s"):
        world.client.quantile(0.95, "vllm:nixl_xfer_time_seconds", 60)
    with pytest.raises(SeriesAbsent, match="no observation"):
        world.direct.quantile(0.95, "vllm:nixl_xfer_time_seconds", 1)


def test_label_values_cannot_change_the_query(world: World) -> None:
    """A match value is a string literal: quotes and braces in it select nothing, they inject nothing."""
    evil = 'disagg"} or vector(1) #'
    with pytest.raises(SeriesAbsent):
        world.client.value("vllm:num_requests_waiting", match={"pool": evil})
    with pytest.raises(QueryError, match="not a label name"):
        world.client.value("vllm:num_requests_waiting", by=("pool) or vector(1",))
    with pytest.raises(QueryError, match="not a metric name"):
        world.client.value("up or vector(1)")


def test_bad_promql_and_bad_arguments_are_query_errors(world: World) -> None:
    with pytest.raises(QueryError, match="refused sum by"):
        world.client.instant("sum by (")
    with pytest.raises(QueryError, match="outside 0..1"):
        world.client.quantile(95, "vllm:time_to_first_token_seconds", 60)
    with pytest.raises(QueryError, match="shorter than one second"):
        world.client.rate("vllm:num_preemptions_total", 0.2)


def test_direct_scrape_needs_a_baseline_as_old_as_the_window(world: World) -> None:
    with pytest.raises(SeriesAbsent, match="no earlier scrape 3600 s ago"):
        world.direct.increase("vllm:num_preemptions_total", 3600)


def test_prometheus_down_is_unavailable(tmp_path: Path) -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(MetricsUnavailable, match="is not answering"):
        client.quantile(0.95, "vllm:time_to_first_token_seconds", 60)
    assert client.ready() is False
    direct = DirectScrape([Target(f"http://127.0.0.1:{free_port()}/metrics")], timeout=2)
    with pytest.raises(MetricsUnavailable, match="is not answering"):
        direct.value("vllm:num_requests_waiting")


def test_a_server_that_is_not_prometheus_is_unavailable(world: World) -> None:
    """Pointing the client at an exporter (a wrong port) says so instead of parsing garbage."""
    client = PrometheusClient(world.target.url.removesuffix("/metrics"))
    with pytest.raises(MetricsUnavailable, match="not JSON"):
        client.instant("up")
