"""The gates' figures from a real Prometheus scraping exporters that carry the gateway's and vLLM's
series: per pool in the gated class, in the gate's unit (ms, fractions, per minute); counters that never
moved are zero when the class has requests; a source that does not answer is an error observation."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from prometheus_client import Counter, Histogram

from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.model.rollout import GateSpec
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.measure import figure, observe
from tests.unit.metrics.helpers import (
    each_seen,
    exporter,
    observation_counts,
    prometheus,
    samples_seen,
    scrape_config,
    wait_for,
)

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

WINDOW = 60
BUCKETS = (0.1, 0.5, 1.0, 5.0)


def _gate(metric: str, **kw: object) -> GateSpec:
    return GateSpec.model_validate({"name": metric.replace("_", "-"), "metric": metric, "max": 1e9, **kw})


@dataclass
class World:
    client: PrometheusClient


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with ExitStack() as stack:
        gw, dec, colo, pre = (stack.enter_context(exporter()) for _ in range(4))
        # the gateway's label sets: every series carries the model (two here: big has the traffic)
        ttft = Histogram(
            "pdfleet_gateway_ttft_seconds",
            "t",
            ["model", "pool", "length_class"],
            buckets=BUCKETS,
            registry=gw.registry,
        )
        requests = Counter(
            "pdfleet_gateway_requests", "r", ["model", "pool", "length_class", "status"], registry=gw.registry
        )
        decisions = Counter(
            "pdfleet_gateway_routing_decisions",
            "d",
            ["model", "stage", "length_class", "pool", "reason"],
            registry=gw.registry,
        )
        fallbacks = Counter(
            "pdfleet_gateway_fallbacks", "f", ["model", "length_class", "reason"], registry=gw.registry
        )
        stalls = Counter(
            "pdfleet_gateway_stream_stalls", "s", ["model", "pool", "length_class"], registry=gw.registry
        )
        tpot = [
            Histogram("vllm:request_time_per_output_token_seconds", "t", buckets=BUCKETS, registry=e.registry)
            for e in (dec, colo)
        ]
        kv = Histogram("vllm:nixl_xfer_time_seconds", "k", buckets=BUCKETS, registry=dec.registry)
        # MooncakeConnector pushes from P: its histogram is on the prefill instances
        pushed = Histogram("vllm:mooncake_xfer_time_seconds", "k", buckets=BUCKETS, registry=pre.registry)
        children = [
            requests.labels("big", "disagg", "long", "200"),
            requests.labels("big", "disagg", "long", "503"),
            requests.labels("big", "colocated", "long", "200"),
            decisions.labels("big", "s", "long", "disagg", "weight"),
            fallbacks.labels("big", "long", "connect"),
            stalls.labels("big", "colocated", "long"),
            ttft.labels("big", "disagg", "long"),
            ttft.labels("big", "colocated", "long"),
            fallbacks.labels("big", "short", "connect"),
            requests.labels("small", "colocated", "long", "200"),
            stalls.labels("small", "colocated", "long"),
        ]  # at zero first
        targets = [
            (f"127.0.0.1:{gw.port}", {"role": "gateway"}),
            (f"127.0.0.1:{dec.port}", {"pool": "disagg", "role": "decode", "model": "big"}),
            (f"127.0.0.1:{colo.port}", {"pool": "colocated", "role": "colocated", "model": "big"}),
            (f"127.0.0.1:{pre.port}", {"pool": "disagg", "role": "prefill", "model": "big"}),
        ]
        prom = stack.enter_context(prometheus(tmp_path_factory.mktemp("prom"), scrape_config(targets)))
        client = prom.client
        # each target is scraped at its own offset (and one's scrape can fail while another's succeeds):
        # every one of them at zero first, the vLLM exporters' histograms as well as the gateway's counters
        zero = {
            "pdfleet_gateway_requests_total": 1,
            "vllm:request_time_per_output_token_seconds_count": 2,
            "vllm:mooncake_xfer_time_seconds_count": 1,
        }
        wait_for(each_seen(client, 2, zero), what="two scrapes of each target at zero")
        for _ in range(40):
            ttft.labels("big", "disagg", "long").observe(0.3)
            ttft.labels("big", "colocated", "long").observe(3.0)
            tpot[0].observe(0.05)
            tpot[1].observe(0.3)
            kv.observe(0.2)
            pushed.observe(2.0)
        children[0].inc(36)
        children[1].inc(4)
        children[2].inc(40)
        children[3].inc(40)
        children[4].inc(8)
        children[5].inc(10)
        children[8].inc(5)  # another class's fallbacks: not the long class's rate
        children[9].inc(20)  # the small model: colocated only, a few stalls
        children[10].inc(6)
        fallback_values = lambda: sorted(s.value for s in client.instant("pdfleet_gateway_fallbacks_total"))  # noqa: E731
        vllm = (
            "request_time_per_output_token_seconds",
            "nixl_xfer_time_seconds",
            "mooncake_xfer_time_seconds",
        )
        counts = lambda: observation_counts(client, *(f"vllm:{name}" for name in vllm))  # noqa: E731
        wait_for(
            lambda: fallback_values() == [5.0, 8.0] and counts() == [[40.0, 40.0], [40.0], [40.0]],
            what="the observations scraped on each target",
        )
        # increase() extrapolates a counter to the window's end by up to 1.1 scrape intervals over the span
        # its samples cover (never to its start here: the first sample in the window is 0), so counts read
        # up to 1.1/span high: after 6 samples (a 5 s span) 22%, which a loaded CI run showed (46 of 40);
        # after 14 (13 s) under 9%, inside the tests' bounds
        wait_for(
            samples_seen(client, "pdfleet_gateway_fallbacks_total", 14), what="13 s of scrapes after them"
        )
        yield World(client)


def test_each_metric_per_pool_in_its_unit(world: World) -> None:
    src = world.client
    ttft = figure(src, _gate("ttft", quantile=0.5), "long", WINDOW)
    assert ttft["disagg"] is not None and 100 < ttft["disagg"] < 500  # ms, in the 0.1-0.5 s bucket
    assert ttft["colocated"] is not None and 1000 < ttft["colocated"] < 5000
    tpot = figure(src, _gate("tpot", quantile=0.5), "long", WINDOW)
    assert tpot["disagg"] is not None and tpot["disagg"] < 100 and tpot["colocated"] is not None
    kv = figure(src, _gate("kv_transfer", quantile=0.5), "long", WINDOW)
    assert kv["disagg"] is not None and 100 < kv["disagg"] < 500 and kv["colocated"] is None
    errors = figure(src, _gate("error_rate"), "long", WINDOW)
    assert errors["disagg"] == pytest.approx(0.1, rel=0.05) and errors["colocated"] == 0.0
    fallback = figure(src, _gate("fallback_rate"), "long", WINDOW)
    assert fallback["disagg"] == pytest.approx(0.2, rel=0.05) and fallback["colocated"] is None
    stall = figure(src, _gate("stalls"), "long", WINDOW)
    assert stall["disagg"] == 0.0 and stall["colocated"] is not None and stall["colocated"] > 0
    nothing = figure(src, _gate("ttft"), "short", WINDOW)
    assert nothing == {"disagg": None, "colocated": None}


def test_the_kv_gate_reads_the_connector_s_histogram_on_the_role_observing_it(world: World) -> None:
    """Mooncake's KV gate (issue 25 item 4): vllm:mooncake_xfer_time_seconds on the prefill instances,
    not NIXL's on the decode instances."""
    gate = _gate("kv_transfer", quantile=0.5)
    kv = ("vllm:mooncake_xfer_time_seconds", "prefill")
    mooncake = figure(world.client, gate, "long", WINDOW, kv=kv)
    assert (
        mooncake["disagg"] is not None and 1000 < mooncake["disagg"] < 5000 and mooncake["colocated"] is None
    )
    nixl = figure(world.client, gate, "long", WINDOW)
    assert nixl["disagg"] is not None and nixl["disagg"] < 500
    observed, _ = observe(world.client, [gate], StageSpec(short=0, long=50), ["long"], WINDOW, True, kv=kv)
    assert observed[0][1].value is not None and observed[0][1].value > 1000


def test_observe_counts_samples_and_leaves_out_kv_without_nixl_metrics(world: World) -> None:
    gates = [_gate("ttft", max_ratio=1.0), _gate("kv_transfer"), _gate("tpot")]
    observed, samples = observe(
        world.client, gates, StageSpec(short=0, long=50), ["long"], WINDOW, kv_transfer_metrics=False
    )
    assert samples in range(38, 46)  # increase() extrapolates over the window
    assert [(g.metric, o.weight) for g, o in observed] == [("ttft", 50), ("tpot", 50)]
    down = PrometheusClient("http://127.0.0.1:9", timeout=1.0)
    observed, samples = observe(down, gates[:1], StageSpec(short=0, long=50), ["long"], WINDOW)
    assert samples == 0 and observed[0][1].error is not None and "not answering" in observed[0][1].error


def test_a_model_reads_its_own_series_and_no_model_sums_them(world: World) -> None:
    src = world.client
    stalls = _gate("stalls")
    every, big, small = (figure(src, stalls, "long", WINDOW, m) for m in (None, "big", "small"))
    assert every["colocated"] is not None and big["colocated"] is not None and small["colocated"] is not None
    assert every["colocated"] == pytest.approx(big["colocated"] + small["colocated"], rel=0.01)
    assert small["colocated"] == pytest.approx(6.0, rel=0.1) and small["disagg"] is None  # no P/D there
    assert figure(src, _gate("ttft", quantile=0.5), "long", WINDOW, "small") == {
        "disagg": None,
        "colocated": None,
    }
    assert figure(src, _gate("ttft", quantile=0.5), "long", WINDOW, "big") == figure(
        src, _gate("ttft", quantile=0.5), "long", WINDOW
    )
    assert figure(src, _gate("tpot", quantile=0.5), "long", WINDOW, "small") == {
        "disagg": None,
        "colocated": None,
    }
    assert figure(src, _gate("tpot", quantile=0.5), "long", WINDOW, "big")["disagg"] is not None
    _, samples = observe(src, [stalls], StageSpec(short=0, long=50), ["long"], WINDOW, model="small")
    assert samples == 0  # the small model sent nothing to a disagg pool
