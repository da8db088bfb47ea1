"""Alert rules: they say what to change in the profile's terms, and a real Prometheus running the
rendered rules fires the KV-transfer alert on slow transfers and resolves it when they stop."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client import Histogram

from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port
from pdfleet.model.profile import Profile
from pdfleet.monitoring.alerts import alert_rules
from pdfleet.monitoring.monitoring_config import dump
from pdfleet.monitoring.recording import chain_steps, recording_rules
from pdfleet.sim.metrics import XFER_BUCKETS
from tests.unit.fleet.helpers import REPO, fleet_of, profile_inventory_pairs
from tests.unit.metrics.helpers import exporter, prometheus, scrape_config, wait_for
from tests.unit.monitoring.helpers import Rendering, alert_check, renderings, run_rule_tests
from tests.unit.monitoring.rule_cases import alert_cases
from tests.unit.sim.helpers import MODEL, kv_config

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def _alerts(profile: Profile, has_gateway: bool) -> dict[str, dict[str, Any]]:
    rules = alert_rules(profile, has_gateway)["groups"][0]["rules"]  # type: ignore[index]
    return {r["alert"]: r for r in rules}


def _sim(profile: Profile, **monitoring: Any) -> Profile:
    return profile.model_copy(
        update={
            "vllm": profile.vllm.model_copy(update={"engine": "sim"}),
            "monitoring": profile.monitoring.model_copy(update=monitoring),
        }
    )


PROFILES = sorted({name for name, _ in profile_inventory_pairs()})


@pytest.mark.parametrize("profile", PROFILES)
def test_every_alert_fires_over_its_thresholds_and_not_under_them_under_promtool(
    profile: str, tmp_path: Path
) -> None:
    """`promtool test rules` on the rendered recording and alert files: each alert, fed raw series on
    either side of the profile's own thresholds, fires (past its `for:`) for exactly the label sets that
    are over them. Every rendered alert has a case."""
    for n, rendering in enumerate(renderings(profile)):
        alerts = rendering.alerts_by_name()
        cases = [c for c in alert_cases(rendering.profile, rendering.has_gateway) if c.alert in alerts]
        assert set(alerts) == {c.alert for c in cases}, f"{rendering.where}: alerts without a case"
        checks = [
            alert_check(
                c,
                alerts[c.alert]["labels"]["severity"],
                rendering.reads(alerts[c.alert]["expr"]),
                rendering.timing,
            )
            for c in cases
        ]
        result = run_rule_tests(rendering.files, checks, rendering.timing, tmp_path / str(n))
        assert result.returncode == 0, f"{rendering.where}:\n{result.stdout}{result.stderr}"
        assert "SUCCESS" in result.stdout


def test_advice_uses_the_profile_terms_and_values() -> None:
    profile = _sim(fleet_of("cross-rdma").profile)
    alerts = _alerts(profile, False)
    budget = profile.pools.prefill.max_num_batched_tokens  # type: ignore[union-attr]
    prefill = alerts["PdfleetPrefillQueueWithIdleGPUs"]["annotations"]["action"]
    assert f"pools.prefill.max_num_batched_tokens: {budget} → {budget * 2}" in prefill
    seqs = profile.pools.decode.max_num_seqs  # type: ignore[union-attr]
    decode = alerts["PdfleetDecodePreemptions"]["annotations"]["action"]
    assert f"pools.decode.max_num_seqs: {seqs} → {seqs // 2}" in decode and "fp8" in decode
    kv = alerts["PdfleetKVTransferSlow"]
    assert kv["expr"].endswith("> 0.2") and "transport is the bottleneck" in kv["annotations"]["summary"]
    assert _alerts(profile, False)["PdfleetTPOTOverSLO"]["expr"].endswith(
        f"> {profile.slo.tpot_p99_ms / 1000:g}"
    )
    assert {r["for"] for r in alerts.values()} == {f"{profile.monitoring.alert_for_s}s"}


def test_a_queue_bound_inside_the_first_bucket_is_held_to_the_bucket() -> None:
    """vLLM's queue histogram starts at 0.3 s: a 200 ms bound would fire on any queue at all (every
    P95 under 0.3 s interpolates to 285 ms), so the alert holds it to 300 ms and says so."""
    profile = _sim(fleet_of("cross-rdma").profile, prefill_queue_p95_ms=200.0)
    alert = _alerts(profile, False)["PdfleetPrefillQueueWithIdleGPUs"]
    assert '{role="prefill"} > 0.3 and on' in alert["expr"]
    assert (
        "inside the queue histogram's first bucket: held to its bound, 300 ms"
        in alert["annotations"]["summary"]
    )
    default = _alerts(_sim(fleet_of("cross-rdma").profile), False)["PdfleetPrefillQueueWithIdleGPUs"]
    assert '{role="prefill"} > 0.5 and on' in default["expr"] and "first bucket" not in str(default)


def test_gateway_alerts_only_with_a_gateway_and_kv_alerts_only_with_nixl_metrics() -> None:
    colocated = fleet_of("colocated").profile
    assert {"PdfleetFallbacks", "PdfleetStreamStalls"} <= set(_alerts(colocated, True))
    assert not {"PdfleetFallbacks", "PdfleetStreamStalls"} & set(_alerts(colocated, False))
    assert "PdfleetKVTransferSlow" not in _alerts(colocated, True)
    cross = fleet_of("cross-rdma").profile  # engine vllm 0.33.0: vllm:nixl_* to alert on
    assert "PdfleetKVTransferSlow" in _alerts(cross, False)
    old = cross.model_copy(update={"vllm": cross.vllm.model_copy(update={"version": "0.11.0"})})
    assert "PdfleetKVTransferSlow" not in _alerts(old, False)  # 0.11 registers none
    assert "PdfleetKVTransferSlow" in _alerts(_sim(cross), False)


def _alert_states(client: Any, name: str) -> list[str]:
    return [a["state"] for a in client.alerts() if a["labels"].get("alertname") == name]


def test_kv_transfer_alert_fires_on_slow_transfers_and_resolves(tmp_path: Path) -> None:
    profile = _sim(
        fleet_of("cross-rdma").profile,
        scrape_interval_s=1,
        evaluation_interval_s=1,
        rule_window_s=6,
        alert_for_s=0,
    )
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "recording.yml").write_text(dump(recording_rules(profile, False)))
    (rules / "alerts.yml").write_text(dump(alert_rules(profile, False)))
    stop = threading.Event()
    with exporter() as exp:
        xfer = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "NIXL transfers",
            ["model_name", "engine"],
            buckets=XFER_BUCKETS,
            registry=exp.registry,
        ).labels("m", "0")

        def slow_link() -> None:
            while not stop.wait(0.1):
                xfer.observe(0.45)  # 450 ms per transfer: over the guide's 200 ms at P95

        labels = {"pool": "disagg", "role": "decode", "host": "lab-d1"}
        config = scrape_config(
            [(f"127.0.0.1:{exp.port}", labels)],
            rule_files=[str(rules / "recording.yml"), str(rules / "alerts.yml")],
        )
        with prometheus(tmp_path / "prom", config) as prom:
            thread = threading.Thread(target=slow_link, daemon=True)
            thread.start()
            try:
                wait_for(
                    lambda: _alert_states(prom.client, "PdfleetKVTransferSlow") == ["firing"],
                    45,
                    "PdfleetKVTransferSlow firing",
                )
                # read while the link is slow: once it is healthy the 6 s window empties and both go
                alerts = prom.client.alerts()
                p95 = prom.client.instant('pool_role:vllm_kv_transfer_seconds:p95{role="decode"}')
            finally:
                stop.set()
                thread.join(5)
            (alert,) = [a for a in alerts if a["labels"]["alertname"] == "PdfleetKVTransferSlow"]
            assert alert["labels"]["role"] == "decode" and alert["labels"]["severity"] == "critical"
            assert "the transport is the bottleneck" in alert["annotations"]["summary"]
            assert p95 and 0.3 < p95[0].value <= 0.5
            # the link is healthy again (no slow transfers in the window): the alert resolves
            wait_for(
                lambda: not _alert_states(prom.client, "PdfleetKVTransferSlow"),
                45,
                "PdfleetKVTransferSlow resolved",
            )


def test_a_slow_sim_link_fires_the_kv_alert_on_real_simulators(tmp_path: Path) -> None:
    """The lab test's premise, on loopback: a P/D pair of simulators whose consumer models KV over TCP
    (--sim-link tcp), driven through the real vllm-router, fires PdfleetKVTransferSlow."""
    profile = _sim(
        fleet_of("cross-rdma").profile,
        scrape_interval_s=1,
        evaluation_interval_s=1,
        rule_window_s=10,
        alert_for_s=0,
    )
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "recording.yml").write_text(dump(recording_rules(profile, False)))
    (rules / "alerts.yml").write_text(dump(alert_rules(profile, False)))
    common = [MODEL, "--sim-time-scale", "0.1"]
    side = free_port()
    producer = SimProcess(
        [*common, "--kv-transfer-config", kv_config("kv_producer")],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess([*common, "--sim-link", "tcp", "--kv-transfer-config", kv_config("kv_consumer")])
    with producer as p, consumer as d, RouterProcess([p.url], [d.url]) as router:
        labels = {
            "p": {"pool": "disagg", "role": "prefill", "host": "p"},
            "d": {"pool": "disagg", "role": "decode", "host": "d"},
        }
        config = scrape_config(
            [(p.url.removeprefix("http://"), labels["p"]), (d.url.removeprefix("http://"), labels["d"])],
            rule_files=[str(rules / "recording.yml"), str(rules / "alerts.yml")],
        )
        client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stop = threading.Event()
        errors: list[BaseException] = []

        def long_prompts() -> None:
            # each prompt its own first word: a decode instance caches the KV it pulled, so a repeated
            # prompt would pull nothing after the first and the link would never look slow
            for n in itertools.count():
                if stop.is_set():
                    return
                try:
                    client.completions.create(
                        model=MODEL, prompt=f"r{n} " + "word " * 8000, max_tokens=4
                    )  # ≈ 10K tokens
                except BaseException as exc:  # noqa: BLE001 - reported by the test, not lost in the thread
                    errors.append(exc)
                    return

        with prometheus(tmp_path / "prom", config) as prom:
            thread = threading.Thread(target=long_prompts, daemon=True)
            thread.start()
            try:
                wait_for(
                    lambda: bool(errors) or _alert_states(prom.client, "PdfleetKVTransferSlow") == ["firing"],
                    90,
                    "PdfleetKVTransferSlow firing on the TCP link",
                )
                assert not errors, errors
                p95 = prom.client.instant('pool_role:vllm_kv_transfer_seconds:p95{role="decode"}')
                assert p95 and p95[0].value > 0.2
            finally:
                stop.set()
                thread.join(60)


def _lab(profile: str) -> Profile:
    return fleet_of(profile, REPO / "inventory/lab.yml").profile


def _alerts_of(profile: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = alert_rules(_lab(profile), True)["groups"][0]["rules"]  # type: ignore[index]
    return rules


def _two_connectors() -> Profile:
    """lab-two-models with a second P/D model on MooncakeConnector beside the NIXL one (and its SLO
    tighter), and the colocated one first: each P/D model's KV series is its own connector's."""
    profile = _lab("lab-two-models")
    big, small = profile.served
    moon = big.model_copy(
        update={
            "name": "moon",
            "kv_transfer": big.kv_transfer.model_copy(update={"connector": "MooncakeConnector"}),
            "slo": big.slo.model_copy(update={"kv_transfer_p99_ms": 100.0, "ttft_p99_ms": 500.0}),
        }
    )
    return profile.model_copy(update={"models": [small, big, moon]})


def test_each_model_s_alerts_read_its_own_series_against_its_own_settings() -> None:
    """lab-two-models: one TTFT rule per model, each selecting its model and comparing with its SLO
    (3000 ms, 1000 ms), labelled and named with its model; the KV alerts only for the P/D model."""
    rules = _alerts_of("lab-two-models")
    ttft = [r for r in rules if r["alert"] == "PdfleetTTFTOverSLO"]
    assert [(r["expr"], r["labels"]) for r in ttft] == [
        (
            'pool_class:gateway_ttft_seconds:p99{model="llama-8b"} > 3',
            {"severity": "warning", "model": "llama-8b"},
        ),
        (
            'pool_class:gateway_ttft_seconds:p99{model="llama-1b"} > 1',
            {"severity": "warning", "model": "llama-1b"},
        ),
    ]
    assert "models[1].slo.ttft_p99_ms (1000 ms)" in ttft[1]["annotations"]["summary"]
    assert {r["labels"].get("model") for r in rules if r["alert"].startswith("PdfleetKV")} == {"llama-8b"}
    single = _alerts_of("lab-cross")
    assert all("model" not in r["labels"] and 'model="' not in r["expr"] for r in single)


def test_two_connectors_record_one_kv_series_apart_by_model_and_alert_per_model_under_promtool(
    tmp_path: Path,
) -> None:
    """Two P/D models on NIXL (decode observes) and Mooncake (prefill observes) and a colocated model
    first: the KV quantile reads both connectors' histograms and keeps them apart by model (promtool, the
    busy and quiet shapes of the chain's cases), and every alert fires over and only over each model's
    own thresholds (the KV P99 of `moon` against its 100 ms)."""
    from tests.unit.monitoring.helpers import RuleCase, buckets, rule_check
    from tests.unit.monitoring.rule_cases import BUSY_A, BUSY_B, QUIET, QUIET_SHAPE

    profile = _two_connectors()
    rendering = Rendering(
        "two connectors",
        dump(recording_rules(profile, True)),
        dump(alert_rules(profile, True)),
        profile,
        True,
    )
    (kv,) = [s for s in chain_steps(profile, True) if s.kv]
    assert kv.histograms == ("vllm:nixl_xfer_time_seconds", "vllm:mooncake_xfer_time_seconds")
    nixl, moon = (
        'pool="disagg", role="decode", model="llama-8b"',
        'pool="disagg", role="prefill", model="moon"',
    )
    case = RuleCase(
        "pool_role:vllm_kv_transfer_seconds:p99",
        "one connector's histogram left out, or two models' transfers merged",
        (
            *buckets("vllm:nixl_xfer_time_seconds", f'{nixl}, instance="a"', BUSY_A),
            *buckets("vllm:nixl_xfer_time_seconds", f'{nixl}, instance="b"', BUSY_B),
            *buckets("vllm:mooncake_xfer_time_seconds", f'{moon}, instance="c"', QUIET_SHAPE),
        ),
        {"{" + nixl + "}": 2.35, "{" + moon + "}": QUIET[0.99]},
    )
    alerts = rendering.alerts_by_name()
    cases = [c for c in alert_cases(profile, True) if c.alert in alerts]
    assert set(alerts) == {c.alert for c in cases}
    checks = [
        rule_check(case, rendering.reads(case.record), rendering.timing),
        *(
            alert_check(
                c,
                alerts[c.alert]["labels"]["severity"],
                rendering.reads(alerts[c.alert]["expr"]),
                rendering.timing,
            )
            for c in cases
        ),
    ]
    result = run_rule_tests(rendering.files, checks, rendering.timing, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
