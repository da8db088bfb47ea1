"""The Grafana dashboard: every panel query is PromQL promtool accepts and reads only series the
recording rules or the scrape targets produce; panels follow the topology."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.monitoring.dashboard import dashboard, dashboard_json, panel_queries
from pdfleet.monitoring.recording import recorded_names
from tests.unit.fleet.helpers import REPO, exported_series, fleet_of, profile_inventory_pairs, series_in
from tests.unit.metrics.helpers import check_promql

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

PAIRS = profile_inventory_pairs()


@pytest.mark.parametrize(("profile", "inventory"), PAIRS, ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_panel_query_is_valid_and_reads_known_series(
    profile: str, inventory: Path, tmp_path: Path
) -> None:
    fleet = fleet_of(profile, inventory)
    model = json.loads(dashboard_json(fleet.profile, fleet.topology))
    queries = panel_queries(model)
    assert queries
    checked = check_promql(queries, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    known = recorded_names(fleet.profile, bool(fleet.topology.gateways)) | exported_series()
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
