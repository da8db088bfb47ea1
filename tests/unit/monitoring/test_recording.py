"""The recording rules: real vLLM and gateway names only, NIXL only where the release exports it."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
import yaml

from pdfleet.bench.launch import RouterProcess, SimProcess
from pdfleet.bench.procs import free_port, stop_processes, wait_http
from pdfleet.fleet.topology import MetricsEndpoint
from pdfleet.model.profile import Profile, VllmSpec
from pdfleet.monitoring.alerts import alert_rules
from pdfleet.monitoring.monitoring_config import dump, scrape_jobs
from pdfleet.monitoring.recording import (
    CHAIN,
    QUANTILES,
    chain_figures,
    chain_steps,
    recorded_names,
    recording_rules,
)
from tests.unit.fleet.helpers import (
    EXAMPLES,
    REPO,
    exported_series,
    fleet_of,
    profile_inventory_pairs,
    series_in,
)
from tests.unit.gateway.helpers import USER_KEY, policy_dict, write_policy
from tests.unit.metrics.helpers import need_prometheus, prometheus, wait_for
from tests.unit.monitoring.helpers import Rendering, renderings, rule_check, run_rule_tests
from tests.unit.monitoring.rule_cases import RULE_CASES
from tests.unit.sim.helpers import MODEL, kv_config

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

INVENTED = ("vllm:kv_transfer_time_seconds", "vllm:prefill_queue_time_seconds")


def _profile(name: str) -> Profile:
    return fleet_of(name).profile


def _rules(profile: Profile, has_gateway: bool) -> list[dict[str, str]]:
    doc = recording_rules(profile, has_gateway)
    return [rule for group in doc["groups"] for rule in group["rules"]]  # type: ignore[index]


@pytest.mark.parametrize("has_gateway", [True, False])
def test_rules_read_only_series_the_targets_export_or_the_rules_record(has_gateway: bool) -> None:
    sim = _with(_profile("cross-rdma"), "sim", "0.11.0")
    exported = exported_series()
    recorded = recorded_names(sim, has_gateway)
    for rule in _rules(sim, has_gateway):
        unknown = series_in(rule["expr"]) - exported - recorded
        assert not unknown, f"{rule['record']} reads {unknown}"
    alerts = alert_rules(sim, has_gateway)["groups"][0]["rules"]  # type: ignore[index]
    for alert in alerts:
        unknown = series_in(alert["expr"]) - exported - recorded
        assert not unknown, f"{alert['alert']} reads {unknown}"


def test_no_invented_metric_name_anywhere() -> None:
    for name in EXAMPLES:
        text = repr(recording_rules(_profile(name), True)) + repr(alert_rules(_profile(name), True))
        for bad in INVENTED:
            assert bad not in text
    assert "vllm:request_queue_time_seconds" in repr(recording_rules(_profile("cross-rdma"), False))


def _with(profile: Profile, engine: str, version: str) -> Profile:
    vllm: VllmSpec = profile.vllm.model_copy(update={"engine": engine, "version": version})
    return profile.model_copy(update={"vllm": vllm})


def test_kv_transfer_is_recorded_only_where_the_release_exports_nixl_metrics() -> None:
    cross = _profile("cross-rdma")
    keys = lambda p: {s.key for s in chain_steps(p, False)}  # noqa: E731
    assert "kv_transfer" not in keys(_with(cross, "vllm", "0.11.0"))  # NIXL metrics came after 0.11.0
    assert "kv_transfer" in keys(_with(cross, "vllm", "0.11.2"))  # the release registers them
    assert "kv_transfer" in keys(_with(cross, "sim", "0.33.0"))  # the simulator exports them as 0.33 does
    assert "kv_transfer" not in keys(_with(cross, "sim", "0.11.0"))  # and not as 0.11 does
    assert "kv_transfer" not in keys(_with(_profile("colocated"), "sim", "0.33.0"))  # nothing to transfer
    names = recorded_names(_with(cross, "sim", "0.33.0"), False)
    assert {f"pool_role:vllm_kv_transfer_seconds:p{q * 100:g}" for q in QUANTILES} <= names


def test_gateway_steps_are_per_length_class_and_vllm_steps_per_pool_and_role() -> None:
    for step in CHAIN:
        assert step.by == (("pool", "length_class") if step.source == "gateway" else ("pool", "role"))
    names = recorded_names(_profile("colocated"), True)
    assert "pool_class:gateway_ttft_seconds:p95" in names and "pool_role:vllm_ttft_seconds:p95" in names
    assert not any(n.startswith("pool_class:") for n in recorded_names(_profile("colocated"), False))
    assert len(_rules(_profile("colocated"), True)) == len(names)  # one rule per recorded name


def test_rule_windows_and_intervals_come_from_the_profile() -> None:
    profile = _profile("colocated")
    mon = profile.monitoring.model_copy(update={"rule_window_s": 120, "evaluation_interval_s": 5})
    doc = recording_rules(profile.model_copy(update={"monitoring": mon}), True)
    assert {g["interval"] for g in doc["groups"]} == {"5s"}  # type: ignore[index]
    assert all(
        "[120s]" in r["expr"]
        for r in _rules(profile.model_copy(update={"monitoring": mon}), True)
        if "rate(" in r["expr"]
    )


def test_each_recorded_name_says_the_labels_its_series_keep() -> None:
    """`level:metric:operation`: the level lists exactly the `by` labels (monitor groups by them)."""
    for figure in chain_figures(_with(_profile("cross-rdma"), "sim", "0.11.0"), True):
        grouped = re.search(r"^(?:\d+ \* )?(?:sum|max) by \(([^)]*)\)", figure.expr)
        if grouped:
            assert figure.labels == tuple(x.strip() for x in grouped.group(1).split(",")), figure.name
    for step in CHAIN:
        assert step.recorded(0.95).split(":")[0] == "_".join(
            "class" if b == "length_class" else b for b in step.by
        )


# ---- every rule an alert reads, evaluated by promtool on hand-written series ----------------------------

PROFILES = sorted({name for name, _ in profile_inventory_pairs()})


def read_by_alerts(rendering: Rendering) -> set[str]:
    """The recorded series the alert rules read, with the recorded series those read (jitter reads P99)."""
    records = rendering.records()
    alerts = rendering.alerts_by_name().values()
    return {name for alert in alerts for name in rendering.reads(alert["expr"]) if name in records}


def test_every_recording_rule_an_alert_reads_has_a_promtool_case() -> None:
    """Enumerated from the rendered files of every profile (with and without a gateway); the gateway's
    event counters count too: healthy traffic never moves them, so only a case evaluates them."""
    cased = {case.record for case in RULE_CASES}
    rendered: set[str] = set()
    for profile in PROFILES:
        for rendering in renderings(profile):
            missing = read_by_alerts(rendering) - cased
            assert not missing, f"{rendering.where}: alerts read {sorted(missing)}, which no case evaluates"
            rendered |= set(rendering.records())
    assert cased >= EVENT_RULES
    assert cased <= rendered, f"cases of no rendered rule: {sorted(cased - rendered)}"


@pytest.mark.parametrize("profile", PROFILES)
def test_recording_rules_give_the_hand_worked_values_under_promtool(profile: str, tmp_path: Path) -> None:
    """`promtool test rules` on the files the monitoring role renders, at the profile's scrape interval,
    evaluation interval and window: each case's record has exactly the expected series and values."""
    for n, rendering in enumerate(renderings(profile)):
        records = rendering.records()
        checks = [
            rule_check(case, rendering.reads(case.record), rendering.timing)
            for case in RULE_CASES
            if case.record in records
        ]
        assert len(checks) >= 20, f"{rendering.where}: only {len(checks)} cases apply"
        result = run_rule_tests(rendering.files, checks, rendering.timing, tmp_path / str(n))
        assert result.returncode == 0, f"{rendering.where}:\n{result.stdout}{result.stderr}"
        assert "SUCCESS" in result.stdout


# ---- the rendered rules on a real stack: simulators, vllm-router, pdfleet-gateway, Prometheus ----------

# Counters of events healthy traffic need not produce (the gateway exports a labelled counter only once
# it counted one): these rules have no value until then, which is the truth, not a zero.
EVENT_RULES = {
    "pool_class:gateway_errors:rate",
    "pool:gateway_stream_errors:rate",
    "reason:gateway_fallbacks:rate",
    "fleet:gateway_fallback:ratio",
    "pool_class:gateway_stream_stalls:per_min",
}
TTFT_BY_CLASS = "pool_class:gateway_ttft_seconds:p95"


def _stream(client: object, pool: str, prompt: str) -> None:
    stream = client.chat.completions.create(  # type: ignore[attr-defined]
        model="llama",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=8,
        stream=True,
        extra_headers={"X-Pdfleet-Pool": pool},
    )
    for _ in stream:
        pass


def test_every_recording_rule_has_a_value_per_pool_on_a_real_stack(tmp_path: Path) -> None:
    """What the lab test checks after provisioning, on loopback processes: streamed traffic through the
    real gateway to both pools gives every rule (but rare-event counters) a value for each pool."""
    need_prometheus()
    fast = {"scrape_interval_s": 1, "evaluation_interval_s": 1, "rule_window_s": 10, "alert_for_s": 0}
    base = fleet_of("lab-cross", REPO / "inventory" / "lab.yml").profile  # the sims model its pin, 0.33.0
    profile = base.model_copy(update={"monitoring": base.monitoring.model_copy(update=fast)})
    common = [MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.1"]
    side = free_port()
    colocated = SimProcess(common)
    producer = SimProcess(
        [*common, "--kv-transfer-config", kv_config("kv_producer")],
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side)},
    )
    consumer = SimProcess(
        [*common, "--sim-link", "roce-400g", "--kv-transfer-config", kv_config("kv_consumer")]
    )
    with colocated as colo, producer as p, consumer as d, RouterProcess([p.url], [d.url]) as router:
        port = free_port()
        policy = policy_dict(
            [colo.url],
            router.url,
            listen={"host": "127.0.0.1", "port": port},
            long_prompt_tokens=8192,
            decider={"colocated_choice": "prefix_load"},  # a prefix index: the estimate's figure has values
        )
        path = write_policy(tmp_path, policy)
        gateway = subprocess.Popen(
            [sys.executable, "-m", "pdfleet.gateway.cli", "--config", str(path), "--log-level", "WARNING"]
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/health", timeout=30, proc=gateway)

            def ep(job: str, url: str, labels: dict[str, str]) -> MetricsEndpoint:
                host, _, number = url.removeprefix("http://").partition(":")
                return MetricsEndpoint(job, "local", host, int(number), {**labels, "host": "local"})

            endpoints = [
                ep("vllm", colo.url, {"pool": "colocated", "role": "colocated"}),
                ep("vllm", p.url, {"pool": "disagg", "role": "prefill"}),
                ep("vllm", d.url, {"pool": "disagg", "role": "decode"}),
                ep("pdfleet-gateway", f"http://127.0.0.1:{port}", {"role": "gateway"}),
            ]
            rules = tmp_path / "recording.yml"
            rules.write_text(dump(recording_rules(profile, True)))
            config = yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": scrape_jobs(endpoints),
                }
            )
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key=USER_KEY, max_retries=0, timeout=60
            )
            stop = threading.Event()
            errors: list[BaseException] = []

            def loop(pool: str) -> None:
                while not stop.is_set():
                    try:
                        _stream(client, pool, "hello there")
                        _stream(client, pool, "word " * 1800)  # ≈ 2250 tokens: still short (< 8192)
                        _stream(client, pool, "word " * 8000)  # ≈ 10K tokens: the long class
                    except BaseException as exc:  # noqa: BLE001 - reported below, not lost in a thread
                        errors.append(exc)
                        return
                    stop.wait(0.5)  # a few requests a second fill every window; a closed loop burned CPU

            with prometheus(tmp_path / "prom", config) as prom:
                threads = [
                    threading.Thread(target=loop, args=(pool,), daemon=True)
                    for pool in ("colocated", "disagg")
                ]
                for t in threads:
                    t.start()
                names = [s.recorded(q) for s in chain_steps(profile, True) for q in QUANTILES]
                names += [f.name for f in chain_figures(profile, True)]
                missing: dict[str, list[str]] = {}

                def all_have_values() -> bool:
                    missing.clear()
                    for name in names:
                        found = {
                            s.labels.get("pool") for s in prom.client.instant(name) if s.value == s.value
                        }
                        want = (
                            {None}
                            if "pool" not in name.split(":")[0].split("_")  # the level names its labels
                            else {"disagg"}
                            if "kv_transfer" in name or "nixl" in name
                            else {"colocated", "disagg"}
                        )
                        if name not in EVENT_RULES and not want <= found:
                            missing[name] = sorted(map(str, found))
                    # the long class is a request of its own, after the short ones: the pools' values
                    # can all be there before it was scraped
                    classes = {s.labels.get("length_class") for s in prom.client.instant(TTFT_BY_CLASS)}
                    if classes != {"short", "long"}:
                        missing[f"{TTFT_BY_CLASS} (length classes)"] = sorted(map(str, classes))
                    return not missing

                try:
                    try:
                        wait_for(all_have_values, 90, "a value per pool for every recording rule")
                    except AssertionError:
                        raise AssertionError(f"rules without a value per pool: {missing}") from None
                    # read while the load runs: once it stops, the 10 s windows empty (NaN) while the
                    # threads finish their requests and this process may wait for CPU
                    classes = {s.labels["length_class"] for s in prom.client.instant(TTFT_BY_CLASS)}
                    kv = prom.client.instant('pool_role:vllm_kv_transfer_seconds:p95{role="decode"}')
                finally:
                    stop.set()
                    for t in threads:
                        t.join(60)
                assert not errors, errors
                assert classes == {"short", "long"}
                assert kv and kv[0].value < 0.2  # 400G RoCE: well under the guide's 200 ms
        finally:
            stop_processes([gateway])
