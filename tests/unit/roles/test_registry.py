"""The role registry: every role package, in run order, each providing the whole Role contract."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from pdfleet.fleet.render import Renderer
from pdfleet.fleet.roles import Role, RoleContext
from pdfleet.hw.gpu_facts import MokEnrolledFact
from pdfleet.hw.rdma_facts import NetdevFact, QosFact
from pdfleet.model.weights import ManifestFile, WeightsManifest
from pdfleet.ops.apt import AptPolicy
from pdfleet.ops.base import Fact, FactSource
from roles import REGISTRY
from tests.unit.hw.helpers import HostFacts, context, fixture_facts, host, pinned
from tests.unit.roles.helpers import REPO, deployment

HOOKS = ("applies", "facts", "operations", "files", "units")
# Facts whose key comes from another fact's value (a netdev of a found device, QoS of that netdev, MOK
# enrollment under Secure Boot): a role cannot name them before the first batch, so they are gathered after.
DERIVED = (NetdevFact, QosFact, MokEnrolledFact, AptPolicy)
H100 = "h100-sxm-8x-nvswitch-cx7"


def test_the_registry_runs_drivers_first_then_the_gateway_monitoring_and_the_rollout_controller() -> None:
    names = [role.NAME for role in REGISTRY]
    assert names == [
        "base",
        "gpu_driver",
        "rdma",
        "kv_transfer",
        "vllm",
        "weights",
        "services",
        "gateway",
        "node_exporter",
        "monitoring",
        "rollout",
    ]


@pytest.mark.parametrize("role", REGISTRY, ids=lambda r: r.NAME)
def test_every_role_provides_the_whole_contract(role: Role) -> None:
    assert isinstance(role.NAME, str) and isinstance(role.APT_PACKAGES, tuple)
    for hook in HOOKS:
        assert callable(getattr(role, hook)), f"{role.NAME} has no {hook}(ctx)"
        assert list(inspect.signature(getattr(role, hook)).parameters)[0] == "ctx"


class _Reads:
    """A FactSource that records what is asked of it."""

    def __init__(self, inner: FactSource) -> None:
        self.inner = inner
        self.asked: list[Fact[Any]] = []

    def get(self, fact: Fact[Any]) -> Any:
        self.asked.append(fact)
        return self.inner.get(fact)


def _hosts() -> list[tuple[str, RoleContext, FactSource]]:
    """A cross-host RDMA prefill host on recorded H100 facts, and lab-cross's gateway and monitoring host."""
    lab = deployment("lab-cross")
    gw = lab.context(lab.inventory.hosts["lab-gw"])
    h100 = dataclasses.replace(context(pinned(), host()), renderer=Renderer(REPO / "templates"))
    staged = deployment("lab-weights")  # a staged model: the weights role applies on its pool hosts
    manifest = WeightsManifest(
        model=staged.profile.model.id,
        revision="lab-r1",
        files=(ManifestFile(path="config.json", size=2, sha256="0" * 64),),
    )
    d1 = dataclasses.replace(
        staged.context(staged.inventory.hosts["lab-d1"]), manifests={staged.profile.model.id: manifest}
    )
    return [("h100", h100, fixture_facts(H100)), ("lab-gw", gw, HostFacts({})), ("lab-d1", d1, HostFacts({}))]


@pytest.mark.parametrize("role", REGISTRY, ids=lambda r: r.NAME)
def test_every_role_declares_the_facts_its_planning_reads(role: Role) -> None:
    """What operations() reads (not the operations' own plans) is in facts(ctx): the runner's first batch
    then holds it, one round trip per host instead of one per fact."""
    ran = False
    for name, ctx, source in _hosts():
        # lab-d1 is there for the weights role: its other roles are checked on the recorded H100's facts
        if not role.applies(ctx) or (name == "lab-d1" and role.NAME != "weights"):
            continue
        ran = True
        reads = _Reads(source)
        list(role.operations(ctx, reads))
        missing = {f for f in reads.asked if not isinstance(f, DERIVED)} - set(role.facts(ctx))
        assert not missing, f"{role.NAME} on {name} reads {missing} without declaring it"
    assert ran, f"{role.NAME} applies to none of the test hosts"
