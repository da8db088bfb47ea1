"""The simulator's vLLM metrics against the facts table: every vllm:* family it exports is one the modelled
release registers, with the same kind, labels and (fixed) bucket bounds."""

from __future__ import annotations

import pytest

from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.sim import more_metrics
from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.metrics import SimCollector, SimMetrics
from tests.unit.sim.helpers import MODEL, kv_config

# Tabled with CacheConfig's attributes and `engine` as labels; the simulator's carries the cache facts it
# models (block size, dtype, memory share, blocks, prefix caching): a subset of vLLM's labels.
LABEL_SUBSET = {"vllm:cache_config_info"}


def _families(version: str) -> dict[str, object]:
    cfg = parse_serve_args(
        [MODEL, "--sim-vllm-version", version, "--kv-transfer-config", kv_config("kv_consumer")], env={}
    )
    metrics = SimMetrics(cfg.max_model_len, pd=True, release=cfg.release, consumer=True)
    collector = SimCollector(metrics, cfg.engine(), MODEL, {"block_size": "16"})
    return {f.name: f for f in collector.collect() if f.name.startswith("vllm:")}  # type: ignore[attr-defined]


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_exported_vllm_metric_is_the_release_s_own(version: str) -> None:
    rel = RELEASES[version]
    families = _families(version)
    for name, fam in families.items():
        row = rel.metric(name)  # KeyError: the release registers no such metric
        assert fam.type == row.kind, name  # type: ignore[attr-defined]
        samples = fam.samples  # type: ignore[attr-defined]
        labels = {k for s in samples for k in s.labels if k != "le"}
        if name in LABEL_SUBSET:
            assert labels < set(row.labels), name
            continue
        assert labels == set(row.labels), name
        for label, values in row.label_values:  # a series per value from the start, as vLLM sets them
            assert {s.labels[label] for s in samples} == set(values), (name, label)
        if row.kind == "histogram" and row.buckets is not None:
            bounds = [float(s.labels["le"]) for s in samples if s.name.endswith("_bucket")]
            assert bounds == [*map(float, row.buckets), float("inf")], name


def test_nixl_metrics_only_where_the_release_registers_them() -> None:
    new, old = _families("0.33.0"), _families("0.11.0")
    nixl = {n for n in RELEASES["0.33.0"].metric_names() if n.startswith("vllm:nixl_")}
    assert nixl == {n for n in new if n.startswith("vllm:nixl_")} and len(nixl) == 8
    assert not any(n.startswith("vllm:nixl_") for n in old)


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_prefix_cache_counters_are_exported_as_the_release_registers_them(version: str) -> None:
    families = _families(version)
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        row = RELEASES[version].metric(name)
        assert row.kind == "counter" and row.when is None  # registered on every start, in both releases
        assert families[name].type == "counter"  # type: ignore[attr-defined]


def test_mooncake_metrics_as_the_release_registers_them() -> None:
    """A Mooncake instance exports MooncakeConnector's six families with the table's kinds and buckets
    (checked by the test above's rules too), and no vllm:nixl_*; 0.11.x registers none of them."""
    cfg = parse_serve_args([MODEL, "--kv-transfer-config", kv_config("kv_producer")], env={})
    metrics = SimMetrics(cfg.max_model_len, pd=False, release=cfg.release, mooncake=True)
    collector = SimCollector(metrics, cfg.engine(), MODEL, {"block_size": "16"})
    families = {f.name: f for f in collector.collect()}  # type: ignore[attr-defined]
    table = {m for m in RELEASES["0.33.0"].metric_names() if m.startswith("vllm:mooncake_")}
    assert {n for n in families if n.startswith("vllm:mooncake_")} == table and len(table) == 6
    assert not any(n.startswith("vllm:nixl_") for n in families)
    for name in table:
        row = RELEASES["0.33.0"].metric(name)
        assert families[name].type == row.kind  # type: ignore[attr-defined]
        if row.buckets:
            bounds = [s.labels["le"] for s in families[name].samples if s.name.endswith("_bucket")]  # type: ignore[attr-defined]
            assert [float(b) for b in bounds] == [*map(float, row.buckets), float("inf")]
    old = SimMetrics(cfg.max_model_len, pd=False, release=RELEASES["0.11.2"], mooncake=True)
    assert not old.mooncake


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_every_family_the_release_always_registers_is_exported(version: str) -> None:
    """Issue 25 item 8: a NIXL consumer exports every family its release registers on every start (the
    stat logger's and NixlConnector's; 0.33's KV-fetch stages on a consumer too), but for the few
    per-request parameters more_metrics names, so dashboards of KV-fetch stages and external-KV tokens
    can be built and checked in the lab."""
    rel = RELEASES[version]
    exported = set(_families(version))
    wanted = {n for n in rel.metric_names() if not n.startswith("vllm:mooncake_")} - more_metrics.NOT_EXPORTED
    if "vllm:num_requests_kv_fetch_by_stage" in rel.metric_names(include_conditional=True):
        wanted.add("vllm:num_requests_kv_fetch_by_stage")
    assert wanted - exported == set()
    if version == "0.33.0":
        assert {"vllm:prompt_tokens_by_source", "vllm:external_prefix_cache_hits"} <= exported
    if version == "0.11.0":
        assert {"vllm:time_per_output_token_seconds", "vllm:iteration_tokens_total"} <= exported
