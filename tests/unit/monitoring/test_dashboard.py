"""The Grafana dashboard: every panel query is PromQL promtool accepts and reads only series the
recording rules or the scrape targets produce; panels follow the topology."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from prometheus_client import Gauge

from pdfleet.bench.procs import free_port, wait_http
from pdfleet.monitoring.dashboard import dashboard, dashboard_json, panel_queries
from pdfleet.monitoring.recording import recorded_names, recording_rules
from tests.unit.fleet.helpers import REPO, exported_series, fleet_of, profile_inventory_pairs, series_in
from tests.unit.metrics.helpers import (
    check_promql,
    exporter,
    prometheus,
    samples_seen,
    scrape_config,
    wait_for,
)

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

PAIRS = profile_inventory_pairs()
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
# The infiniband collector's series exist only where /sys/class/infiniband does (not on this machine):
# their names as the exporter's binary spells them (collector/infiniband_linux.go builds node_infiniband_*).
INFINIBAND = ("port_data_received_bytes_total", "port_data_transmitted_bytes_total")


@pytest.fixture(scope="module")
def node_series() -> set[str]:
    """Every series name Debian's node exporter serves here (started on loopback), and its RDMA ports'."""
    if shutil.which(NODE_EXPORTER) is None:
        pytest.skip("prometheus-node-exporter not installed (./dev setup installs it)")
    binary = Path(NODE_EXPORTER).read_bytes()
    assert all(name.encode() in binary for name in INFINIBAND)
    port = free_port()
    proc = subprocess.Popen(
        [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_http(url, 20, proc)
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)
    names = {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")
    }
    return names | {f"node_infiniband_{name}" for name in INFINIBAND}


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_panel_query_is_valid_and_reads_known_series(
    profile: str, inventory: Path, tmp_path: Path, node_series: set[str]
) -> None:
    fleet = fleet_of(profile, inventory)
    model = json.loads(dashboard_json(fleet.profile, fleet.topology))
    chosen = model["templating"]["list"][0]["current"]["value"]  # as Grafana pastes it in
    queries = [query.replace("$model", chosen) for query in panel_queries(model)]
    assert queries
    checked = check_promql(queries, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    known = recorded_names(fleet.profile, bool(fleet.topology.gateways)) | exported_series() | node_series
    for query in queries:
        assert series_in(query) <= known, f"{query} reads {series_in(query) - known}"


def test_panels_follow_the_topology() -> None:
    lab = fleet_of("lab-cross", REPO / "inventory" / "lab.yml")
    titles = [p["title"] for p in dashboard(lab.profile, lab.topology)["panels"]]
    assert "TTFT at the gateway — disagg pool" in titles and "TTFT at the gateway — colocated pool" in titles
    assert "KV transfer time (vllm:nixl_xfer_time_seconds)" in titles  # the lab runs the simulator
    assert "Routing decisions by stage" in titles
    same = fleet_of("lab-same-host", REPO / "inventory" / "lab-same-host.yml")  # the sim as vLLM 0.11.0
    titles = [p["title"] for p in dashboard(same.profile, same.topology)["panels"]]
    assert not any("KV transfer time" in t for t in titles)  # 0.11 registers no vllm:nixl_*
    cross = fleet_of("cross-rdma")  # real vLLM 0.33.0: a NIXL panel; its colocated baseline has a gateway
    titles = [p["title"] for p in dashboard(cross.profile, cross.topology)["panels"]]
    assert "TTFT at the gateway — colocated pool" in titles
    assert "KV transfer time (vllm:nixl_xfer_time_seconds)" in titles
    assert "queue time (WAITING) — prefill instances" in titles
    assert "queue time (WAITING) — decode instances" in titles


def test_quantile_panels_show_the_first_bucket_as_under_its_bound() -> None:
    """A request-time quantile under 0.3 s reads `<300 ms` in Grafana, never the interpolated figure."""
    lab = fleet_of("lab-cross", REPO / "inventory" / "lab.yml")
    panels = {p["title"]: p for p in dashboard(lab.profile, lab.topology)["panels"]}
    queue = panels["queue time (WAITING) — prefill instances"]
    (mapping,) = queue["fieldConfig"]["defaults"]["mappings"]
    assert mapping["options"] == {"from": 0, "to": 0.3, "result": {"text": "<300 ms"}}
    assert "first bucket" in queue["description"]
    ttft = panels["TTFT at the gateway — disagg pool"]["fieldConfig"]["defaults"]["mappings"]
    assert ttft[0]["options"]["result"]["text"] == "<5 ms"
    assert panels["Targets up"]["fieldConfig"]["defaults"]["mappings"] == []


def test_the_model_is_importable_json_with_a_datasource_input() -> None:
    fleet = fleet_of("colocated")
    model = json.loads(dashboard_json(fleet.profile, fleet.topology))
    assert model["__inputs"][0]["name"] == "DS_PROMETHEUS"
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    for panel in model["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
            assert 0 <= panel["gridPos"]["x"] < 24


def test_the_model_variable_selects_one_models_series_on_a_real_prometheus(tmp_path: Path) -> None:
    """lab-two-models: both models run a colocated pool; each option of the `model` variable keeps its own
    model's series (vLLM's label: the name; the gateway's: the group name) and never the other's."""
    fleet = fleet_of("lab-two-models", REPO / "inventory" / "lab.yml")
    doc = dashboard(fleet.profile, fleet.topology)
    variable = doc["templating"]["list"][0]
    assert variable["name"] == "model" and [o["text"] for o in variable["options"]] == [
        "llama-8b",
        "llama-1b",
    ]
    series = "pool_role:vllm_kv_cache_usage_perc:max"
    query = next(q for q in panel_queries(doc) if q.startswith(series))
    rules = recording_rules(fleet.profile, True)
    for group in rules["groups"]:  # type: ignore[attr-defined]
        group["interval"] = "1s"  # the profile's 15 s would make the test wait for it
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    with exporter() as big, exporter() as small, exporter() as other:
        targets: list[tuple[str, Mapping[str, str]]] = []
        for exp, name, value in ((big, "llama-8b", 0.75), (small, "llama-1b", 0.25), (other, "llama-8", 0.5)):
            Gauge("vllm:kv_cache_usage_perc", "KV", registry=exp.registry).set(value)
            targets.append(
                (f"127.0.0.1:{exp.port}", {"pool": "colocated", "role": "colocated", "model": name})
            )
        config = scrape_config(targets, rule_files=[str(tmp_path / "rules.yml")])
        with prometheus(tmp_path / "prom", config) as prom:
            # a series per model, each from its own target scraped at its own offset: all three, not the first
            wait_for(
                samples_seen(prom.client, series, 2, series=3),
                what="the KV usage rule evaluated twice for each model",
            )
            for option, value in zip(variable["options"], (0.75, 0.25), strict=True):
                got = prom.client.instant(query.replace("$model", option["value"]))
                assert [(s.labels["model"], s.value) for s in got] == [(option["text"], value)]
    single = fleet_of("lab-cross", REPO / "inventory" / "lab.yml")  # the gateway labels by alias there
    (only,) = dashboard(single.profile, single.topology)["templating"]["list"][0]["options"]
    assert only["value"] == "llama\\\\-3\\\\-1\\\\-8b|llama\\\\-3\\\\.1\\\\-8b"
