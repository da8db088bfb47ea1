"""Fixture loading for the hardware tests: fact outputs (with their format sources) → FakeFacts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from pdfleet.hw import gpu_facts, os_facts, rdma_facts
from pdfleet.model.inventory import Host
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile
from pdfleet.ops import apt, files, kernel, pip, systemd, users
from pdfleet.ops.apt import AptHolds, AptPackages, AptPolicy, CommandRc
from pdfleet.ops.base import Fact, FakeFacts
from pdfleet.ops.files import DirectoryState, FileContent, FileState
from pdfleet.ops.kernel import LoadedModules
from pdfleet.ops.pip import PipList
from pdfleet.ops.unit_health import UnitHealth, UnitState

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[3]
PIN = "570.133.20"
H100_DEVICES = tuple(f"mlx5_{i}" for i in range(8))
# where fixture keys are looked up: the hardware facts, then the ops domains' facts
FACT_MODULES = (gpu_facts, os_facts, rdma_facts, kernel, files, apt, systemd, users, pip)


def fact_for(key: str) -> Fact[Any]:
    """`NetdevFact(ens1np0)` → NetdevFact("ens1np0"); `KernelFact` → KernelFact() (hardware or generic)."""
    m = re.fullmatch(r"(\w+)(?:\((.*)\))?", key)
    assert m, key
    cls = next(getattr(mod, m[1]) for mod in FACT_MODULES if hasattr(mod, m[1]))
    args = [a.strip() for a in m[2].split(",")] if m[2] else []
    if cls is AptPolicy:  # its one argument is the tuple of names
        return AptPolicy(tuple(args))
    return cls(*args)  # type: ignore[no-any-return]


def load_fixture(name: str) -> dict[Fact[Any], Any]:
    """Parsed facts of one fixture host; every entry must name the source of its format."""
    data = yaml.safe_load((FIXTURES / f"{name}.yml").read_text())
    table: dict[Fact[Any], Any] = {}
    for key, entry in data["facts"].items():
        assert entry.get("source"), f"{name}: {key} does not say where its format comes from"
        fact = fact_for(key)
        table[fact] = fact.parse(entry["stdout"], entry.get("rc", 0))
    return table


class HostFacts(FakeFacts):
    """Fixture hardware facts plus a fresh host for the generic ones (nothing installed yet)."""

    def __init__(self, table: dict[Fact[Any], Any], overrides: dict[Fact[Any], Any] | None = None):
        super().__init__({**table, **(overrides or {})})

    def get(self, fact: Fact[Any]) -> Any:
        try:
            return super().get(fact)
        except KeyError:
            pass
        if isinstance(fact, gpu_facts.MokEnrolledFact):
            return False
        if isinstance(fact, os_facts.OsReleaseFact):  # the lab's hosts: Debian 12
            return load_fixture("lab-container")[fact]
        if isinstance(fact, rdma_facts.QosFact):
            return rdma_facts.QosState(None, None)
        if isinstance(fact, AptPackages):
            return {}
        if isinstance(fact, AptHolds | LoadedModules):
            return frozenset()
        if isinstance(fact, FileState | DirectoryState | FileContent | PipList):
            return None
        if isinstance(fact, UnitHealth):
            return UnitState("not-found", "inactive", "dead", "")
        if isinstance(fact, CommandRc):
            return 1
        raise KeyError(f"no fake value for {fact!r}")


def fixture_facts(name: str, overrides: dict[Fact[Any], Any] | None = None) -> HostFacts:
    return HostFacts(load_fixture(name), overrides)


def profile(name: str = "cross-rdma", **sections: dict[str, Any]) -> Profile:
    """A shipped profile with some sections' fields replaced (e.g. gpu={"driver_version": PIN})."""
    base = load_profile(name, REPO / "profiles")
    update = {key: getattr(base, key).model_copy(update=vals) for key, vals in sections.items()}
    return base.model_copy(update=update)


def pinned(name: str = "cross-rdma", kv_transfer: dict[str, Any] | None = None, **gpu: Any) -> Profile:
    """The profile with the driver pinned to the fixtures' 570.133.20 (gpu fields overridable)."""
    extra = {"kv_transfer": kv_transfer} if kv_transfer else {}
    return profile(name, gpu={"driver_branch": "570", "driver_version": PIN, **gpu}, **extra)


def host(
    name: str = "gpu-01",
    groups: tuple[str, ...] = ("prefill",),
    gpus: tuple[int, ...] = tuple(range(8)),
    rdma_devices: tuple[str, ...] = H100_DEVICES,
    rdma_netdev: str | None = "ens1np0",
) -> Host:
    return Host(
        name,
        frozenset(groups),
        {},
        "10.20.1.11",
        gpus=gpus,
        rdma_devices=rdma_devices,
        rdma_netdev=rdma_netdev,
    )


def context(prof: Profile, h: Host) -> Any:
    """A RoleContext for one host alone in its fleet (roles here read host, profile and instances only)."""
    from pdfleet.fleet.roles import RoleContext
    from pdfleet.fleet.topology import build_topology
    from pdfleet.model.inventory import Inventory

    inventory = Inventory(Path("<one host>"), {h.name: h}, {group: (h.name,) for group in h.groups})
    return RoleContext(h, prof, build_topology(prof, inventory), None)  # type: ignore[arg-type]


def run_role(role: Any, ctx: Any, facts: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """(operations, skips, changes planned against the facts) of a role on one host."""
    from pdfleet.ops.base import Skip

    items = list(role.operations(ctx, facts))
    ops = [i for i in items if not isinstance(i, Skip)]
    skips = [i for i in items if isinstance(i, Skip)]
    changes = [c for op in ops for c in op.plan(facts)]
    return ops, skips, changes


def commands(changes: list[Any]) -> list[str]:
    """Every shell command (and upload destination) of the planned changes."""
    out = []
    for change in changes:
        for cmd in change.commands:
            out.append(getattr(cmd, "cmd", None) or f"upload {cmd.dest}")
    return out
