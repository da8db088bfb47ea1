"""Tuning rules from figures (each branch), and the metric names they read are the release's own."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.doctor.fleet_facts import RoleFigures
from pdfleet.doctor.metrics_rules import (
    KV_USAGE,
    PREEMPTIONS,
    QUEUE,
    WAITING,
    gather_figures,
    kv_usage_metric,
    rule_metrics_read,
    rule_preemption,
    rule_prefill_queue,
)
from pdfleet.metrics.direct import DirectScrape, Target
from pdfleet.model.vllm_release_data import RELEASES
from tests.unit.doctor.helpers import deployment
from tests.unit.sim.helpers import MODEL


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


def test_a_model_of_a_models_profile_is_advised_in_its_own_keys() -> None:
    """lab-two-models: a rule reading one model's view names that model and its `models[i]` key paths."""
    profile = deployment("lab-two-models").profile
    big, small = profile.served
    busy = RoleFigures("colocated", preemptions_per_min=30, kv_usage=0.99)
    (found,) = rule_preemption(profile.for_model(small), {"colocated": busy})
    assert (found.rule, found.subject) == ("tuning.colocated_preemption", "llama-1b/colocated")
    assert found.what.startswith("model llama-1b: the colocated instances preempt")
    half = max(1, small.pools.colocated.max_num_seqs // 2)  # type: ignore[union-attr]
    assert f"+models[1].pools.colocated.max_num_seqs: {half}" in (found.diff or "")
    assert "profiles/lab-two-models.yml" in (found.diff or "")
    queued = {"prefill": RoleFigures("prefill", queue_p95_s=2.0, waiting=12, kv_usage=0.1)}
    (advice,) = rule_prefill_queue(profile.for_model(big), queued)
    assert (
        advice.subject == "llama-8b/prefill" and "models[0].pools.prefill.tensor_parallel_size" in advice.fix
    )


@pytest.mark.procs  # starts real processes: see tests/unit/conftest.py
def test_each_model_s_figures_are_read_from_its_own_instances() -> None:
    """Two simulators as two models' colocated instances (their targets carry `model`), requests sent to
    one: its model's queue P95 is read, the idle model's is absent (said), never the other's figure."""
    release = RELEASES[deployment("lab-two-models").profile.vllm.version]
    with SimProcess([MODEL, "--sim-time-scale", "0.02"]) as busy, SimProcess([MODEL]) as idle:
        targets = [
            Target(busy.url + "/metrics", {"role": "colocated", "model": "llama-8b"}),
            Target(idle.url + "/metrics", {"role": "colocated", "model": "llama-1b"}),
        ]
        # one source per model read, each with its baseline before the requests (a read scrapes again:
        # a second read of one source could compare with a scrape taken after them)
        sources = {m: DirectScrape(targets) for m in ("llama-8b", "llama-1b")}
        for source in sources.values():
            source.scrape()
        started = time.monotonic()
        for n in range(3):
            body = {"model": MODEL, "prompt": f"request{n} " + "word " * 50, "max_tokens": 2}
            request = urllib.request.Request(
                busy.url + "/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=60) as resp:
                resp.read()
        time.sleep(max(0.0, started + 1.0 - time.monotonic()))  # a window of at least a second
        window = time.monotonic() - started
        read = {
            m: gather_figures(source, release, {"colocated": 1}, window, m) for m, source in sources.items()
        }
    assert read["llama-8b"]["colocated"].queue_p95_s is not None
    assert read["llama-1b"]["colocated"].queue_p95_s is None
    assert any(m.startswith("queue P95") for m in read["llama-1b"]["colocated"].missing)
