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
    host_kv_profile,
    host_wheel_install,
    instance_restart,
    instance_unit,
    role_units,
    select_roles,
)
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.hw.kv import kv_import_name
from pdfleet.model.profile import Profile
from pdfleet.ops.base import FakeFacts, Operation, Run
from pdfleet.ops.files import Directory, File, FileContent
from pdfleet.ops.pip import PipRequirements
from roles import REGISTRY
from tests.unit.fleet.helpers import REPO, deploy, fleet_of, two_pd_deployment


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
    # lab-gw is the monitoring host too: its node exporter, then Prometheus, Alertmanager and the lab's
    # recorder come last, as their roles do
    expected = [
        ("vllm-router-pd.service", 8090),
        ("pdfleet-gateway.service", 8080),
        ("prometheus-node-exporter.service", 9100),
        ("prometheus.service", 9091),  # lab-cross's monitoring.port
        ("prometheus-alertmanager.service", 9095),  # and monitoring.alertmanager.port
        ("pdfleet-notification-recorder.service", 9097),
    ]
    assert [(u.unit, u.port) for u in units] == expected
    pool_host = role_units(fleet.roles, fleet.context(fleet.inventory.hosts["lab-d1"]))
    assert [u.unit for u in pool_host] == ["vllm-decode.service", "prometheus-node-exporter.service"]


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


def test_host_wide_kv_settings_follow_the_model_whose_pd_instance_the_host_runs(tmp_path: Path) -> None:
    for path in (REPO / "profiles").glob("*.yml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "two-pd.yml").write_text(
        "extends: lab-cross\ngateway: {model_alias: null}\nmodels:\n  - {name: nixl, aliases: [a]}\n"
        "  - name: moon\n    aliases: [b]\n"
        "    kv_transfer: {connector: MooncakeConnector, mooncake_protocol: tcp}\n"
        "    gateway: {router_port: 8091, router_prometheus_port: 29001}\n"
        "    pools:\n      prefill: {port: 8101, gpus: [1], hosts: [p2]}\n"
        "      decode: {port: 8201, gpus: [1], hosts: [d1]}\n"
        "      colocated: {port: 8001, gpus: [1], hosts: [c1]}\n"
    )
    inventory = tmp_path / "inv.yml"
    inventory.write_text(
        "all:\n  hosts:\n    p2: {ansible_host: 10.0.0.22, gpus: [0, 1]}\n  children:\n"
        "    prefill: {hosts: {p1: {ansible_host: 10.0.0.21, gpus: [0, 1]}}}\n"
        "    decode: {hosts: {d1: {ansible_host: 10.0.0.31, gpus: [0, 1]}}}\n"
        "    colocated: {hosts: {c1: {ansible_host: 10.0.0.11, gpus: [0, 1]}}}\n"
    )
    fleet = deploy("two-pd", inventory, tmp_path)
    connector = {
        name: fleet.context(host).kv_profile.kv_transfer.connector
        for name, host in fleet.inventory.hosts.items()
    }
    # d1 runs both models' decode instances: the first one's (in the profile's order) sets the host-wide file
    assert connector == {
        "p2": "MooncakeConnector",
        "p1": "NixlConnector",
        "d1": "NixlConnector",
        "c1": "NixlConnector",
    }
    assert [i.unit for i in fleet.topology.on_host("p2")] == ["vllm-moon-prefill.service"]


def test_a_host_s_kv_settings_follow_its_own_p_d_model(tmp_path: Path) -> None:
    """Two P/D models on two connectors: each pool host's KV profile is its own model's (the roles install
    its transfer library and verify checks that one), a host without a P/D instance the first model's."""
    d = two_pd_deployment(tmp_path)

    def on(host: str) -> Profile:
        return host_kv_profile(d.profile, d.topology.on_host(host))

    assert [on(h).kv_transfer.connector for h in ("lab-p1", "lab-d1", "lab-p2", "lab-d2")] == [
        "NixlConnector",
        "NixlConnector",
        "MooncakeConnector",
        "MooncakeConnector",
    ]
    # each host's own connector's library (lab-cross leaves kv_transfer.sim_library off: docs/kv-path.md)
    assert [kv_import_name(on(h)) for h in ("lab-p1", "lab-p2")] == ["nixl", "mooncake"]
    assert on("lab-colo2").served[0].name == "nixl-8b"  # no P/D instance there: the first model
    ctx = d.context(d.inventory.hosts["lab-d2"])
    assert ctx.kv_profile.kv_transfer.connector == "MooncakeConnector"
