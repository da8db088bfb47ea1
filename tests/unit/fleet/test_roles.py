"""The role contract's helpers: picking roles for a run, their apt packages, and what every role of a host
shares about a vLLM instance (its restart handler and managed unit), and the one host-wheel install sequence
the gateway and rollout roles both run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import roles.gateway as gateway_role
import roles.rollout as rollout_role
from pdfleet.errors import ValidationError
from pdfleet.fleet.host_layout import VLLM_START_TIMEOUT_S
from pdfleet.fleet.host_wheel import wheel_name
from pdfleet.fleet.roles import (
    apt_packages,
    host_wheel_install,
    instance_restart,
    instance_unit,
    role_units,
    select_roles,
)
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.ops.base import FakeFacts, Operation, Run
from pdfleet.ops.files import Directory, File, FileContent
from pdfleet.ops.pip import PipRequirements
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
        ("prometheus.service", 9091),  # lab-cross's monitoring.port
    ]
    assert [(u.unit, u.port) for u in units] == expected
    pool_host = role_units(fleet.roles, fleet.context(fleet.inventory.hosts["lab-d1"]))
    assert [u.unit for u in pool_host] == ["vllm-decode.service"]


def _contains_run(ops: list[Operation], run: list[Operation]) -> bool:
    """Whether `run` appears in `ops` as consecutive operations."""
    return any(ops[i : i + len(run)] == run for i in range(len(ops) - len(run) + 1))


def test_gateway_and_rollout_install_host_code_by_the_one_sequence(tmp_path: Path) -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory/lab.yml")
    wheel = tmp_path / wheel_name(fleet.host_version)
    wheel.write_bytes(b"PK-not-really-a-wheel")
    secrets = GatewaySecrets("1" * 64, "2" * 64, "sk-pdfleet-test-admin-key")
    fleet = dataclasses.replace(fleet, host_wheel=wheel, gateway_secrets=secrets)
    ctx = fleet.context(fleet.inventory.hosts["lab-gw"])  # gateway and monitoring host
    sequence = host_wheel_install(ctx, "/opt/x", ("extra==1",))
    assert [type(op) for op in sequence] == [Directory, Directory, File, PipRequirements]
    upload, pip = sequence[2], sequence[3]
    assert isinstance(upload, File) and isinstance(pip, PipRequirements)
    assert upload.path == f"/opt/pdfleet/wheels/{wheel.name}" and upload.content == wheel.read_bytes()
    assert pip.requirements == (f"pdfleet=={fleet.host_version}", "extra==1")
    assert pip.find_links == ("/opt/pdfleet/wheels",)
    facts = FakeFacts({FileContent(gateway_role.POLICY_FILE): None})
    gw_ops = [op for op in gateway_role.operations(ctx, facts) if isinstance(op, Operation)]
    restarts = tuple(next(op for op in gw_ops if isinstance(op, PipRequirements)).notify)
    router = f"vllm-router=={fleet.profile.gateway.router_version}"
    assert _contains_run(gw_ops, host_wheel_install(ctx, gateway_role.VENV, (router,), restarts))
    ro_ops = [op for op in rollout_role.operations(ctx, FakeFacts()) if isinstance(op, Operation)]
    restart = tuple(next(op for op in ro_ops if isinstance(op, PipRequirements)).notify)
    assert fleet.topology.controller is not None
    venv = fleet.topology.controller.venv
    assert _contains_run(ro_ops, host_wheel_install(ctx, venv, notify=restart))
    # without a wheel (a site whose index serves it) nothing is uploaded and pip looks nowhere else
    plain = host_wheel_install(dataclasses.replace(fleet, host_wheel=None).context(ctx.host), "/opt/x")
    assert [type(op) for op in plain] == [Directory, PipRequirements]
    assert isinstance(plain[1], PipRequirements) and plain[1].find_links == ()
