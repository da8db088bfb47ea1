"""What bench takes from a deployment: the gateway, the pools and their GPU counts (2 colocated GPUs meet
1 prefill + 1 decode GPU in the lab), the metrics endpoints, and the client key read, never created."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from prometheus_client import Gauge

from pdfleet.bench.fleet_targets import (
    ModelSeries,
    bench_model,
    direct_targets,
    gateway_of,
    gpu_count,
    kv_histogram,
    metrics_sources,
    pools_of,
    read_client_key,
)
from pdfleet.errors import ValidationError
from pdfleet.metrics.direct import DirectScrape
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.model.profile_loader import load_profile
from tests.unit.fleet.helpers import deploy, monitoring_on_port
from tests.unit.metrics.helpers import exporter, prometheus, samples_seen, scrape_config, wait_for

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

REPO = Path(__file__).resolve().parents[3]


def _lab(profile: str = "lab-cross"):  # noqa: ANN202
    return deploy(profile, REPO / "inventory" / "lab.yml", roles=(), secrets=None)


def test_lab_cross_compares_two_colocated_gpus_with_one_prefill_and_one_decode() -> None:
    d = _lab()
    assert pools_of(d.topology) == ("colocated", "disagg")
    assert (gpu_count(d.topology, "colocated"), gpu_count(d.topology, "disagg")) == (2, 2)
    gw = gateway_of(d.profile, d.topology, "sk-x")
    assert (gw.host, gw.port, gw.model) == ("198.18.0.10", 8080, "llama-3.1-8b")
    labels = {(t.labels["pool"], t.labels["role"]) for t in direct_targets(d.topology)}
    assert labels == {
        ("colocated", "colocated"),
        ("disagg", "prefill"),
        ("disagg", "decode"),
    }


@pytest.mark.parametrize(
    ("profile", "model", "histogram"),
    [
        ("lab-cross", None, "vllm:nixl_xfer_time_seconds"),
        ("lab-cross-mooncake", None, "vllm:mooncake_xfer_time_seconds"),
        ("lab-same-host", None, None),  # 0.11.0: NixlConnector registers no metric
        ("lab-two-models", "llama-1b", None),  # colocated only
        ("lab-colocated", None, None),
    ],
)
def test_the_kv_transfer_histogram_is_the_connector_s_on_the_pinned_release(
    profile: str, model: str | None, histogram: str | None
) -> None:
    """Issue 25: bench reads the P/D pool's KV transfer from the histogram the facts table says its
    connector registers on its pin (a Mooncake bench showed n/a: it read NIXL's name only)."""
    prof = load_profile(profile, REPO / "profiles")
    assert kv_histogram(prof, bench_model(prof, model)) == histogram


def test_a_colocated_profile_has_only_the_colocated_pool() -> None:
    assert pools_of(_lab("lab-colocated").topology) == ("colocated",)


def test_no_monitoring_answering_falls_back_to_direct_scrapes() -> None:
    d = _lab()
    notes: list[str] = []
    sources, what = metrics_sources(dataclasses.replace(d.topology, monitoring=()), notes.append)
    source, kv = sources("disagg")
    assert isinstance(source, DirectScrape) and isinstance(kv, DirectScrape) and source is not kv
    assert [t.labels["role"] for t in source.targets] == ["prefill", "decode"]  # that pool's own endpoints
    assert what == "direct scrape of 4 vLLM endpoint(s)" and not notes


def test_client_key_is_read_never_created(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no gateway client key at .*provision the gateway first"):
        read_client_key(str(tmp_path / "nope.key"))
    assert not (tmp_path / "nope.key").exists()
    key = tmp_path / "k"
    key.write_text("sk-pdfleet-abc\n")
    os.chmod(key, 0o644)
    with pytest.raises(ValidationError, match="readable by its owner only") as err:
        read_client_key(str(key))
    assert "sk-pdfleet-abc" not in str(err.value)
    os.chmod(key, 0o600)
    assert read_client_key(str(key)) == "sk-pdfleet-abc"


def test_prometheus_is_read_on_the_profiles_monitoring_port(tmp_path: Path) -> None:
    """monitoring.port other than 9090: bench reads the Prometheus listening there, not a fixed port."""
    with prometheus(tmp_path / "prom", scrape_config([])) as prom:
        assert prom.port != 9090
        profiles, profile, inventory = monitoring_on_port(tmp_path, prom.port)
        d = deploy(str(profile), inventory, profiles, roles=(), secrets=None)
        notes: list[str] = []
        sources, what = metrics_sources(d.topology, notes.append)
        source, kv = sources("disagg")
        assert what == f"Prometheus at http://127.0.0.1:{prom.port}" and not notes
        assert isinstance(source, PrometheusClient) and source.base_url == prom.url and kv is source


def test_two_models_bench_the_disaggregated_one_unless_told() -> None:
    d = _lab("lab-two-models")
    assert bench_model(d.profile, None).name == "llama-8b"  # the first disaggregated model
    small = bench_model(d.profile, "llama-1b")
    assert pools_of(d.topology, "llama-1b") == ("colocated",)  # colocated only: no router, no disagg
    assert pools_of(d.topology, "llama-8b") == ("colocated", "disagg")
    assert gpu_count(d.topology, "colocated", "llama-1b") == 1  # lab-colo2's second GPU
    assert gpu_count(d.topology, "colocated", "llama-8b") == 2
    assert gpu_count(d.topology, "colocated") == 3  # every model's
    assert gateway_of(d.profile, d.topology, "sk-x", small.aliases[0]).model == "llama-3.2-1b"
    assert {t.labels["model"] for t in direct_targets(d.topology, "colocated", "llama-1b")} == {"llama-1b"}
    with pytest.raises(ValidationError) as err:
        bench_model(d.profile, "gpt-4o")
    assert str(err.value) == (
        "--model gpt-4o: profile lab-two-models serves no such model; models: llama-8b, llama-1b"
    )


def test_a_models_series_leave_the_other_models_same_pool_out(tmp_path: Path) -> None:
    """Both models run a colocated pool: the bench of one reads its own instances' gauge, not the sum."""
    with exporter() as big, exporter() as small:
        for exp, value in ((big, 0.75), (small, 0.25)):
            Gauge("vllm:kv_cache_usage_perc", "KV", registry=exp.registry).set(value)
        targets: list[tuple[str, Mapping[str, str]]] = [
            (f"127.0.0.1:{big.port}", {"pool": "colocated", "role": "colocated", "model": "llama-8b"}),
            (f"127.0.0.1:{small.port}", {"pool": "colocated", "role": "colocated", "model": "llama-1b"}),
        ]
        with prometheus(tmp_path / "prom", scrape_config(targets)) as prom:
            # each target is scraped at its own offset: both models' gauges, not the first one's
            wait_for(
                samples_seen(prom.client, "vllm:kv_cache_usage_perc", 2, series=2),
                what="two scrapes of each target",
            )
            match = {"pool": "colocated"}
            both = prom.client.value("vllm:kv_cache_usage_perc", ("role",), match)
            assert both == {("colocated",): 1.0}
            for model, value in (("llama-8b", 0.75), ("llama-1b", 0.25)):
                got = ModelSeries(prom.client, model).value("vllm:kv_cache_usage_perc", ("role",), match)
                assert got == {("colocated",): value}
