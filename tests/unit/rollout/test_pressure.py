"""The automatic rebalance's figures from a real Prometheus scraping exporters with vLLM's series under the
monitoring role's target labels (prefill queue time P95, decode ITL P95, the busiest decode instance's KV
usage, preemptions per minute, instances up per pool), and the controller's rebalancer recording a dry-run
proposal with them in the audit log; the cool-down read back from the log after a restart."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client import Counter, Gauge, Histogram

from pdfleet.bench.procs import free_port
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.model.rebalancing import RebalanceSpec
from pdfleet.rollout.config import ControllerConfig
from pdfleet.rollout.controller import Controller
from pdfleet.rollout.gateways import GatewayClient
from pdfleet.rollout.pressure import EVENT, AutoRebalancer, read_figures
from pdfleet.rollout.store import Store
from tests.unit.metrics.helpers import (
    each_seen,
    exporter,
    observation_counts,
    prometheus,
    scrape_config,
    wait_for,
)

pytestmark = pytest.mark.procs  # starts Prometheus: see tests/unit/conftest.py

WINDOW = 30


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusClient]:
    with ExitStack() as stack:
        pre, d1, d2 = (stack.enter_context(exporter()) for _ in range(3))
        queue = Histogram(
            "vllm:request_queue_time_seconds", "q", buckets=(0.1, 0.5, 1.0, 5.0), registry=pre.registry
        )
        itl = [
            Histogram(
                "vllm:inter_token_latency_seconds", "i", buckets=(0.01, 0.025, 0.05, 0.1), registry=e.registry
            )
            for e in (d1, d2)
        ]
        kv = [Gauge("vllm:kv_cache_usage_perc", "k", registry=e.registry) for e in (d1, d2)]
        preempted = [Counter("vllm:num_preemptions", "p", registry=e.registry) for e in (d1, d2)]
        kv[0].set(0.3)
        kv[1].set(0.5)
        targets = [
            (f"127.0.0.1:{pre.port}", {"pool": "disagg", "role": "prefill", "host": "p1"}),
            (f"127.0.0.1:{d1.port}", {"pool": "disagg", "role": "decode", "host": "d1"}),
            (f"127.0.0.1:{d2.port}", {"pool": "disagg", "role": "decode", "host": "d2"}),
        ]
        prom = stack.enter_context(prometheus(tmp_path_factory.mktemp("prom"), scrape_config(targets)))
        # each target is scraped at its own offset (and one's scrape can fail while another's succeeds):
        # every one of them, the prefill exporter's histogram and both decode exporters', at zero first
        seen = {"vllm:request_queue_time_seconds_count": 1, "vllm:inter_token_latency_seconds_count": 2}
        wait_for(each_seen(prom.client, 2, seen), what="two scrapes of each target at zero")
        for _ in range(20):
            queue.observe(0.9)
            for hist in itl:
                hist.observe(0.02)
        preempted[1].inc(0)
        count = lambda: observation_counts(  # noqa: E731
            prom.client, "vllm:request_queue_time_seconds", "vllm:inter_token_latency_seconds"
        )
        wait_for(lambda: count() == [[20.0], [20.0, 20.0]], what="the observations scraped on each target")
        wait_for(each_seen(prom.client, 4, seen), what="scrapes after them")
        yield prom.client


def test_the_figures_per_pool_in_their_units(client: PrometheusClient) -> None:
    f = read_figures(client, WINDOW)
    assert f.prefill_queue_p95_ms is not None and 500 < f.prefill_queue_p95_ms <= 1000  # ms, its bucket
    assert f.decode_itl_p95_ms is not None and 10 < f.decode_itl_p95_ms <= 25
    assert f.decode_kv_usage == pytest.approx(0.5)  # the busiest decode instance
    assert f.decode_preemptions_per_min == 0.0
    assert f.ttft_p95_ms is None  # no gateway here: no data
    assert dict(f.hosts) == {"prefill": 1, "decode": 2, "colocated": 0}


def test_a_dry_run_proposal_is_recorded_with_its_numbers_and_the_cool_down_survives_a_restart(
    client: PrometheusClient, tmp_path: Path
) -> None:
    spec = RebalanceSpec.model_validate({"mode": "dry-run", "reaction_s": 0, "cooldown_s": 600})
    store, now = Store(tmp_path), [1000.0]
    rebalancer = AutoRebalancer(spec, client, store, lambda: now[0])
    event = rebalancer.tick()
    assert event is not None and (event["from"], event["to"], event["mode"]) == (
        "decode",
        "prefill",
        "dry-run",
    )
    recorded = [e for e in store.history() if e["event"] == EVENT]
    assert len(recorded) == 1 and recorded[0]["figures"]["hosts"] == {
        "prefill": 1,
        "decode": 2,
        "colocated": 0,
    }
    assert str(recorded[0]["why"]).startswith("prefill queue P95 ")
    now[0] += 60
    restarted = AutoRebalancer(spec, client, store, lambda: now[0])
    assert restarted.tick() is None  # still pressed, but cooling down (read back from the audit log)
    assert [e["event"] for e in store.history()] == [EVENT]


def test_the_controllers_loop_records_the_proposal_and_a_controller_with_it_off_has_none(
    client: PrometheusClient, tmp_path: Path
) -> None:
    """With rollout.rebalance.mode dry-run the controller's loop asks the rebalancer after each rollout
    tick, even one that cannot reach its gateway (nothing listens on the admin URL here)."""
    port = free_port()

    def controller(rebalance: dict[str, object]) -> Controller:
        config = ControllerConfig.model_validate(
            {
                "profile": "test",
                "rollout": {"interval_s": 0.2, "rebalance": rebalance},
                "stages": {"colocated": {"short": 0, "long": 0}},
                "initial_stage": "colocated",
                "slo": {},
                "gateways": [{"name": "gw0", "admin_url": f"http://127.0.0.1:{port}"}],
                "prometheus_url": client.base_url,
                "stage_key_file": str(tmp_path / "key"),
                "state_dir": str(tmp_path / str(len(rebalance))),
            }
        )
        return Controller(config, client, GatewayClient("k", 0.5), Store(Path(config.state_dir)))

    assert controller({}).rebalancer is None
    on = controller({"mode": "dry-run", "reaction_s": 0})
    stop = threading.Event()
    loop = threading.Thread(target=on.run, args=(stop,))
    loop.start()
    try:
        wait_for(lambda: any(e["event"] == EVENT for e in on.store.history()), what="the proposal recorded")
    finally:
        stop.set()
        loop.join(10)
    proposal = next(e for e in on.store.history() if e["event"] == EVENT)
    assert (proposal["from"], proposal["to"]) == ("decode", "prefill")
