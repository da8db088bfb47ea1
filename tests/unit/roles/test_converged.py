"""A second run on a converged host plans nothing: the hardware roles against an H100 host whose
state matches what the first run would have written."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import roles.gpu_driver as gpu_role
import roles.kv_transfer as kv_role
import roles.rdma as rdma_role
from pdfleet.hw import rdma_facts
from pdfleet.ops.apt import AptHolds, AptPackage, AptPackages, AptRepo
from pdfleet.ops.base import REBOOT_REQUIRED
from pdfleet.ops.files import File, FileState, PathInfo
from pdfleet.ops.kernel import KernelModule, LoadedModules, module_name
from pdfleet.ops.pip import PipList, PipRequirements
from pdfleet.ops.systemd import Service, SystemdUnit
from pdfleet.ops.unit_health import UnitHealth, UnitState
from tests.unit.hw.helpers import context, fixture_facts, host, load_fixture, pinned, run_role

H100 = "h100-sxm-8x-nvswitch-cx7"


def _file(content: str | bytes, mode: str = "0644") -> PathInfo:
    data = content.encode() if isinstance(content, str) else content
    return PathInfo("file", mode, "root", "root", len(data), hashlib.sha256(data).hexdigest())


def converged_state(ops: list[Any]) -> dict[Any, Any]:
    """Facts describing a host on which every operation has already been applied."""
    table: dict[Any, Any] = {}
    packages: dict[str, str] = {}
    holds: set[str] = set()
    modules: set[str] = set()
    for op in ops:
        if isinstance(op, SystemdUnit):
            table[FileState(f"{op.directory}/{op.name}")] = _file(op.content)
        elif isinstance(op, File):
            table[FileState(op.path)] = _file(op.content, op.mode)
        elif isinstance(op, AptRepo):
            table[FileState(f"/etc/apt/sources.list.d/{op.name}.list")] = _file(op.source_line())
            if op.keyring_path():
                table[FileState(op.keyring_path())] = _file(b"key")
        elif isinstance(op, AptPackage):
            packages[op.name] = (op.version or "1.0").replace("*", "1")
            if op.hold:
                holds.add(op.name)
        elif isinstance(op, KernelModule):
            modules.add(module_name(op.name))
            table[FileState(f"/etc/modules-load.d/{op.name}.conf")] = _file(f"{op.name}\n")
        elif isinstance(op, Service):
            table[UnitHealth(op.unit)] = UnitState("loaded", "active", "running", "enabled")
        elif isinstance(op, PipRequirements):
            table[PipList(op.venv)] = {"nixl": "1.5.0"}  # what vLLM 0.33's nixl>=1.5.0 installs
    table[AptPackages()] = packages
    table[AptHolds()] = frozenset(holds)
    table[LoadedModules()] = frozenset(modules)
    return table


def converged_nics() -> dict[Any, Any]:
    """The H100 fixture after the RoCE script ran: RoCE v2 default mode, mlx5_0 QoS set."""
    table = load_fixture(H100)
    devices = {
        name: dataclasses.replace(
            dev, ports=tuple(dataclasses.replace(p, default_roce_mode="RoCE v2") for p in dev.ports)
        )
        for name, dev in table[rdma_facts.RdmaSysfsFact()].items()
    }
    return {
        rdma_facts.RdmaSysfsFact(): devices,
        rdma_facts.QosFact("ens1np0", "mlnx_qos"): table[rdma_facts.QosFact("ens2np0", "mlnx_qos")],
    }


def test_second_run_on_converged_h100_plans_no_change() -> None:
    ctx = context(pinned(), host())
    roles = (gpu_role, rdma_role, kv_role)
    first: list[Any] = []
    for role in roles:
        ops, _, changes = run_role(role, ctx, fixture_facts(H100))
        assert changes, f"{role.NAME}: a fresh host needs changes"
        first += ops
    facts = fixture_facts(H100, {**converged_state(first), **converged_nics()})
    for role in roles:
        _, skips, changes = run_role(role, ctx, facts)
        assert changes == [], f"{role.NAME} is not idempotent: {[c.diff for c in changes]}"
        assert not any(s.what == REBOOT_REQUIRED for s in skips)


def test_a_host_with_an_older_nixl_is_upgraded_for_the_pinned_release() -> None:
    """vLLM 0.33 checks NIXL >= 1.5.0 at start: a venv holding 0.8.0 (enough for 0.11) gets a change."""
    ctx = context(pinned(), host())
    ops, _, _ = run_role(kv_role, ctx, fixture_facts(H100))
    state = converged_state(ops)
    state[PipList("/opt/pdfleet/venv")] = {"nixl": "0.8.0"}
    _, _, changes = run_role(kv_role, ctx, fixture_facts(H100, {**state, **converged_nics()}))
    assert [c.op for c in changes] == ["pip in /opt/pdfleet/venv: nixl>=1.5.0"]
