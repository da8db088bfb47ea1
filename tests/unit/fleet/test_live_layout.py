"""The live layout: the inventory's pool groups rewritten to the layout `invoke rebalance` left, so the
topology (units, router and gateway pools, Prometheus labels) follows the moved host; its state file
round-trips; bad state and layouts that cannot apply are refused naming the file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import DeploymentRequest, load_deployment
from pdfleet.fleet.live_layout import (
    HostPools,
    apply_layout,
    audit_file,
    layout_file,
    read_layout,
    record,
    write_layout,
)
from pdfleet.fleet.mover import MovePlan, layout_of, plan_move
from tests.unit.fleet.helpers import REPO
from tests.unit.roles.helpers import deployment

LAB = REPO / "inventory/lab.yml"
STATE = Path("/state/layouts/lab-lab-cross.json")


def _moved() -> dict[str, tuple[str, ...]]:
    """lab-cross's layout with lab-colo2 moved from colocated to decode, as the mover computes it."""
    fleet = deployment("lab-cross")
    out = plan_move(layout_of(fleet.profile.served[0], fleet.inventory), "lab-colo2", "decode")
    assert isinstance(out, MovePlan)
    return dict(out.after.hosts)


def _request(layout: tuple[Path, HostPools] | None) -> DeploymentRequest:
    return DeploymentRequest("lab-cross", LAB, REPO / "profiles", REPO / "templates", layout=layout)


def test_the_deployment_follows_the_live_layout() -> None:
    fleet = load_deployment(_request((STATE, _moved())))
    topo = fleet.topology
    assert [(i.host, i.pool) for i in topo.on_host("lab-colo2")] == [("lab-colo2", "decode")]
    assert [i.host for i in topo.pool("decode")] == ["lab-colo2", "lab-d1"]
    assert [i.host for i in topo.pool("colocated")] == ["lab-colo1"]
    labels = [dict(e.labels) for e in topo.metrics_endpoints if e.host == "lab-colo2" and e.job == "vllm"]
    assert [(x["pool"], x["role"]) for x in labels] == [("disagg", "decode")]
    assert "decode" in fleet.inventory.hosts["lab-colo2"].groups
    assert "colocated" not in fleet.inventory.hosts["lab-colo2"].groups
    # without a live layout: the inventory's
    plain = load_deployment(_request(None))
    assert [(i.host, i.pool) for i in plain.topology.on_host("lab-colo2")] == [("lab-colo2", "colocated")]


def test_the_state_file_round_trips_and_the_audit_log_appends(tmp_path: Path) -> None:
    state = layout_file(tmp_path, LAB, "lab-cross")
    assert state == tmp_path / "layouts" / "lab-lab-cross.json"
    assert read_layout(state) is None
    write_layout(state, "lab-cross", LAB, _moved())
    assert read_layout(state) == _moved()
    record(state, {"event": "move", "host": "lab-colo2", "reason": "by hand"})
    record(state, {"event": "reset", "reason": "r"})
    lines = [json.loads(line) for line in audit_file(state).read_text().splitlines()]
    assert [e["event"] for e in lines] == ["move", "reset"] and lines[0]["host"] == "lab-colo2"


def test_a_broken_state_file_is_refused_naming_it_and_the_reset(tmp_path: Path) -> None:
    state = tmp_path / "x.json"
    state.write_text('{"profile": "lab-cross", "inventory": "i", "hosts": {"a": "decode"}, "extra": 1}')
    with pytest.raises(ValidationError, match=r"(?s)x\.json: not a live layout.*--layout-from-inventory"):
        read_layout(state)


def test_an_unknown_host_in_the_layout_is_refused() -> None:
    fleet = deployment("lab-cross")
    with pytest.raises(ValidationError, match=r"lab-cross\.json: host lab-x9 is not in .*lab\.yml"):
        apply_layout(fleet.inventory, fleet.profile.served[0], {"lab-x9": ("decode",)}, STATE)


def test_a_pool_the_profile_does_not_set_is_refused() -> None:
    fleet = deployment("lab-colocated")
    with pytest.raises(ValidationError, match="host lab-colo2: the profile sets no pool 'decode'"):
        apply_layout(fleet.inventory, fleet.profile.served[0], {"lab-colo2": ("decode",)}, STATE)


def test_a_profile_listing_models_is_refused() -> None:
    fleet = deployment("lab-two-models")
    with pytest.raises(ValidationError, match="single-model profile"):
        apply_layout(fleet.inventory, fleet.profile.served[0], {"lab-colo2": ("colocated",)}, STATE)
