"""The recording rules: real vLLM and gateway names only, NIXL only where the release exports it."""

from __future__ import annotations

import pytest

from pdfleet.fleet.alerts import alert_rules
from pdfleet.fleet.recording import CHAIN, QUANTILES, chain_steps, recorded_names, recording_rules
from pdfleet.model.profile import Profile, VllmSpec
from tests.unit.fleet.helpers import EXAMPLES, exported_series, fleet_of, series_in

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
    assert "kv_transfer" in keys(_with(cross, "vllm", "0.12.0"))
    assert "kv_transfer" in keys(_with(cross, "sim", "0.11.0"))  # the simulator exports them
    assert "kv_transfer" not in keys(_with(_profile("colocated"), "sim", "0.11.0"))  # nothing to transfer
    names = recorded_names(_with(cross, "sim", "0.11.0"), False)
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
    assert all("[120s]" in r["expr"] for r in _rules(profile.model_copy(update={"monitoring": mon}), True)
               if "rate(" in r["expr"])


def test_each_recorded_name_says_the_labels_its_series_keep() -> None:
    """`level:metric:operation`: the level lists exactly the `by` labels (monitor groups by them)."""
    import re

    from pdfleet.fleet.recording import chain_figures

    for figure in chain_figures(_with(_profile("cross-rdma"), "sim", "0.11.0"), True):
        grouped = re.search(r"^(?:\d+ \* )?(?:sum|max) by \(([^)]*)\)", figure.expr)
        if grouped:
            assert figure.labels == tuple(x.strip() for x in grouped.group(1).split(",")), figure.name
    for step in CHAIN:
        assert step.recorded(0.95).split(":")[0] == "_".join(
            "class" if b == "length_class" else b for b in step.by)
