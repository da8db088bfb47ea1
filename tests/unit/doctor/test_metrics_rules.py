"""Tuning rules from figures (each branch), and the metric names they read are the release's own."""

from __future__ import annotations

import dataclasses

from pdfleet.doctor.fleet_facts import RoleFigures
from pdfleet.doctor.metrics_rules import (
    KV_USAGE,
    PREEMPTIONS,
    QUEUE,
    WAITING,
    kv_usage_metric,
    rule_metrics_read,
    rule_preemption,
    rule_prefill_queue,
)
from pdfleet.model.vllm_release_data import RELEASES
from tests.unit.doctor.helpers import deployment


def test_every_name_read_is_registered_by_every_release() -> None:
    for release in RELEASES.values():
        names = release.metric_names(include_conditional=True)
        assert {QUEUE, WAITING, PREEMPTIONS} <= set(names)
        assert kv_usage_metric(release) in KV_USAGE


def test_prefill_queue_high_with_idle_gpus_raises_the_budget() -> None:
    profile = deployment("lab-cross").profile
    budget = profile.pools.prefill.max_num_batched_tokens  # type: ignore[union-attr]
    busy = {"prefill": RoleFigures("prefill", queue_p95_s=2.0, waiting=12, kv_usage=0.1)}
    found = rule_prefill_queue(profile, busy)
    assert [f.rule for f in found] == ["tuning.prefill_queue"]
    assert f"+pools.prefill.max_num_batched_tokens: {budget * 2}" in (found[0].diff or "")
    assert "tensor_parallel_size" in found[0].fix
    # a short queue, or a full KV cache (the GPUs are busy), or no figure: no advice
    assert (
        rule_prefill_queue(profile, {"prefill": dataclasses.replace(busy["prefill"], queue_p95_s=0.01)}) == []
    )
    assert rule_prefill_queue(profile, {"prefill": dataclasses.replace(busy["prefill"], kv_usage=0.9)}) == []
    assert rule_prefill_queue(profile, {"prefill": RoleFigures("prefill")}) == []


def test_frequent_decode_preemption() -> None:
    profile = deployment("lab-cross").profile
    spec = profile.pools.decode
    assert spec is not None
    found = rule_preemption(profile, {"decode": RoleFigures("decode", preemptions_per_min=30, kv_usage=0.99)})
    assert [f.rule for f in found] == ["tuning.decode_preemption"]
    assert f"+pools.decode.max_num_seqs: {max(1, spec.max_num_seqs // 2)}" in (found[0].diff or "")
    assert "fp8" in found[0].fix
    assert rule_preemption(profile, {"decode": RoleFigures("decode", preemptions_per_min=0.0)}) == []


def test_frequent_colocated_preemption_names_the_colocated_pool() -> None:
    """The colocated baseline is advised in its own terms; decode and colocated each get their finding."""
    profile = deployment("lab-cross").profile
    spec = profile.pools.colocated
    assert spec is not None
    busy = RoleFigures("colocated", preemptions_per_min=30, kv_usage=0.99)
    found = rule_preemption(profile, {"colocated": busy})
    assert [(f.rule, f.subject) for f in found] == [("tuning.colocated_preemption", "colocated")]
    half = max(1, spec.max_num_seqs // 2)
    assert f"pools.colocated.max_num_seqs {spec.max_num_seqs} → {half}" in found[0].fix
    assert f"+pools.colocated.max_num_seqs: {half}" in (found[0].diff or "")
    assert "pools.decode" not in found[0].fix + (found[0].diff or "")
    both = {"colocated": busy, "decode": dataclasses.replace(busy, role="decode")}
    assert [f.rule for f in rule_preemption(profile, both)] == [
        "tuning.decode_preemption",
        "tuning.colocated_preemption",
    ]
    quiet = dataclasses.replace(busy, preemptions_per_min=profile.monitoring.decode_preemptions_per_min)
    assert rule_preemption(profile, {"colocated": quiet}) == []  # at the limit, not over it


def test_gpu_memory_utilization_only_with_headroom() -> None:
    profile = deployment("lab-cross").profile
    figures = {"decode": RoleFigures("decode", preemptions_per_min=30)}
    for util, advised in ((0.90, True), (0.93, False)):
        pools = profile.pools.model_copy(
            update={
                "decode": profile.pools.decode.model_copy(  # type: ignore[union-attr]
                    update={"gpu_memory_utilization": util, "kv_cache_dtype": "fp8"}
                )
            }
        )
        fix = rule_preemption(profile.model_copy(update={"pools": pools}), figures)[0].fix
        assert ("gpu_memory_utilization 0.9 → 0.95" in fix) is advised
        assert "fp8 (pools" not in fix  # already fp8: not advised again


def test_unread_figures_are_said_not_zeroed() -> None:
    found = rule_metrics_read(
        "direct scrape", {"decode": RoleFigures("decode", missing=("waiting: no target",))}
    )
    assert found[0].severity == "warning" and "waiting: no target" in found[0].evidence
    assert rule_metrics_read("x", {"decode": RoleFigures("decode")}) == []
