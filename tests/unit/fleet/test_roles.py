"""The role contract's helpers: picking roles for a run, their apt packages, and what every role of a host
shares about a vLLM instance (its restart handler and managed unit)."""

from __future__ import annotations

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.host_layout import VLLM_START_TIMEOUT_S
from pdfleet.fleet.roles import apt_packages, instance_restart, instance_unit, role_units, select_roles
from pdfleet.ops.base import Run
from roles import REGISTRY
from tests.unit.fleet.helpers import REPO, fleet_of


def test_apt_packages_of_all_roles_include_base() -> None:
    found = apt_packages(REGISTRY)
    assert "jq" in found and list(found) == sorted(set(found))


def test_select_roles_keeps_registry_order_and_names_unknown_ones() -> None:
    assert [r.NAME for r in select_roles(REGISTRY, "services, base")] == ["base", "services"]
    assert select_roles(REGISTRY, None) == REGISTRY
    with pytest.raises(ValidationError, match="unknown role.*bogus.*available: base"):
        select_roles(REGISTRY, "base,bogus")


def test_every_role_notifies_one_restart_per_instance() -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory/lab.yml")
    [inst] = fleet.topology.on_host("lab-p1")
    handler = instance_restart(inst)
    assert handler == instance_restart(inst) and handler.unit == "vllm-prefill.service"
    waits = [c.cmd for c in handler.commands if isinstance(c, Run)]
    assert any(inst.health_url in cmd and str(int(VLLM_START_TIMEOUT_S)) in cmd for cmd in waits), waits
    unit = instance_unit(inst)
    assert (unit.unit, unit.port, unit.health_url) == (inst.unit, inst.port, inst.health_url)


def test_role_units_of_a_gateway_host_are_the_router_then_the_gateway() -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory/lab.yml")
    units = role_units(fleet.roles, fleet.context(fleet.inventory.hosts["lab-gw"]))
    # lab-gw is the monitoring host too: Prometheus comes last, as its role does
    expected = [
        ("vllm-router-pd.service", 8090),
        ("pdfleet-gateway.service", 8080),
        ("prometheus.service", 9090),
    ]
    assert [(u.unit, u.port) for u in units] == expected
    pool_host = role_units(fleet.roles, fleet.context(fleet.inventory.hosts["lab-d1"]))
    assert [u.unit for u in pool_host] == ["vllm-decode.service"]
