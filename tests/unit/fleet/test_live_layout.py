"""The live layout: the inventory's pool groups rewritten to the layout `invoke rebalance` left, so the
topology (units, router and gateway pools, Prometheus labels) follows the moved host; its file round-trips
on the gateway hosts (through this machine's shell) with its audit log, gateway hosts that disagree are
refused; bad state and layouts that cannot apply are refused naming the file and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import DeploymentRequest, load_deployment
from pdfleet.fleet.layout_store import FleetLayout
from pdfleet.fleet.live_layout import (
    HostPools,
    agreed_layout,
    apply_layout,
    copy_file,
    layout_text,
    parse_layout,
    read_copy,
    write_copy,
)
from pdfleet.fleet.mover import MovePlan, layout_of, plan_move
from pdfleet.model.inventory import Host
from pdfleet.ops.ssh import LocalTransport, Transport
from tests.unit.fleet.helpers import REPO
from tests.unit.roles.helpers import deployment

LAB = REPO / "inventory/lab.yml"
STATE = "lab-gw:/var/lib/pdfleet/layouts/lab-cross.json"


def _moved() -> dict[str, tuple[str, ...]]:
    """lab-cross's layout with lab-colo2 moved from colocated to decode, as the mover computes it."""
    fleet = deployment("lab-cross")
    out = plan_move(layout_of(fleet.profile.served[0], fleet.inventory), "lab-colo2", "decode")
    assert isinstance(out, MovePlan)
    return dict(out.after.hosts)


def _request(layout: tuple[str, HostPools] | None) -> DeploymentRequest:
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


def _store(root: Path, keepers: list[str]) -> FleetLayout:
    """The live layout kept under `root` on `keepers`, each reached through this machine's shell."""
    hosts = deployment("lab-cross").inventory.hosts

    def connect(host: Host) -> Transport:
        return LocalTransport(host.name)

    return FleetLayout([hosts[name] for name in keepers], connect, "lab-cross", str(root / "layouts"), False)


@pytest.mark.procs  # this machine's shell stands for the gateway hosts
def test_the_fleet_keeps_the_layout_and_its_audit_log(tmp_path: Path) -> None:
    store = _store(tmp_path, ["lab-gw"])
    assert store.path == f"{tmp_path}/layouts/lab-cross.json"
    assert store.read() is None and store.texts() == {"lab-gw": None}
    store.write(layout_text("profiles/lab-cross.yml", LAB, _moved()))
    assert store.read() == _moved()
    assert json.loads(Path(store.path).read_text())["profile"] == "lab-cross"
    store.record({"event": "moved", "host": "lab-colo2", "reason": "by hand"})
    store.record({"event": "reset", "reason": "r"})
    lines = [json.loads(line) for line in store.audit()["lab-gw"].splitlines()]
    assert [e["event"] for e in lines] == ["moved", "reset"] and lines[0]["host"] == "lab-colo2"
    store.write(None)
    assert store.read() is None and store.audit()["lab-gw"]  # the audit log stays
    store.write(None)  # nothing to remove: no error


@pytest.mark.procs
def test_gateway_hosts_that_disagree_are_refused_one_without_a_layout_is_not(tmp_path: Path) -> None:
    moved = layout_text("lab-cross", LAB, _moved())
    assert agreed_layout({"gw1": moved, "gw2": None}, "p") == _moved()
    other = layout_text("lab-cross", LAB, {**_moved(), "lab-colo2": ("colocated",)})
    with pytest.raises(ValidationError, match=r"gateway hosts gw1, gw2 keep different live layouts in p;"):
        agreed_layout({"gw1": moved, "gw2": other}, "p")
    # two keepers reached through one shell share the file: written once each, read back agreeing
    store = _store(tmp_path, ["lab-gw", "lab-colo1"])
    store.write(moved)
    assert store.texts() == {"lab-gw": moved, "lab-colo1": moved} and store.read() == _moved()


def test_the_local_copy_round_trips(tmp_path: Path) -> None:
    copy = copy_file(tmp_path, LAB, "lab-cross")
    assert copy == tmp_path / "layouts" / "lab-lab-cross.json"
    assert read_copy(copy) is None
    write_copy(copy, layout_text("lab-cross", LAB, _moved()))
    assert read_copy(copy) == _moved()
    write_copy(copy, None)
    assert not copy.exists()


def test_a_broken_layout_is_refused_naming_where_and_the_reset() -> None:
    text = '{"profile": "lab-cross", "inventory": "i", "hosts": {"a": "decode"}, "extra": 1}'
    with pytest.raises(ValidationError, match=r"(?s)gw:/x\.json: not a live layout.*--layout-from-inventory"):
        parse_layout(text, "gw:/x.json")


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
