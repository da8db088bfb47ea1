"""The services role retires pdfleet's vLLM and router units a host no longer runs under the profile."""

from __future__ import annotations

import roles.services as services_role
from pdfleet.ops.base import FakeFacts
from pdfleet.ops.systemd import ManagedUnitFiles, RetireUnits
from tests.unit.roles.helpers import deployment

# what provisioning lab-cross left on its hosts
LAB_CROSS_UNITS = {
    "lab-gw": {"vllm-router-pd.service"},
    "lab-colo2": {"vllm-colocated.service"},
    "lab-p1": {"vllm-prefill.service"},
}


def _retire(profile: str, host: str) -> RetireUnits:
    fleet = deployment(profile)
    ops = list(services_role.operations(fleet.context(fleet.inventory.hosts[host]), FakeFacts()))
    first = ops[0]
    assert isinstance(first, RetireUnits)  # before any unit starts: an old one may hold its port
    return first


def test_switching_lab_cross_to_two_models_retires_lab_cross_units_on_every_host() -> None:
    fact = ManagedUnitFiles(services_role.UNIT_GLOB)
    for host, old in LAB_CROSS_UNITS.items():
        op = _retire("lab-two-models", host)
        fleet = deployment("lab-two-models")
        now = {i.unit for i in fleet.topology.on_host(host)}
        now |= {r.unit for r in fleet.topology.routers_on(host)}
        assert now and not now & old  # the units are renamed (vllm-{model}-{pool})
        diffs = [c.diff for c in op.plan(FakeFacts({fact: frozenset(old | now)}))]
        assert [d.split()[4] for d in diffs] == sorted(old), host
        assert op.plan(FakeFacts({fact: frozenset(now)})) == []  # converged: nothing to remove


def test_provisioning_lab_cross_again_retires_the_two_model_units() -> None:
    two = deployment("lab-two-models")
    fact = ManagedUnitFiles(services_role.UNIT_GLOB)
    op = _retire("lab-cross", "lab-colo2")
    found = frozenset(i.unit for i in two.topology.on_host("lab-colo2"))
    assert [c.diff.split()[4] for c in op.plan(FakeFacts({fact: found}))] == sorted(found)
    assert op.keep == {"vllm-colocated.service"}


def test_a_host_running_nothing_still_retires() -> None:
    fleet = deployment("lab-cross")
    ctx = fleet.context(fleet.inventory.hosts["lab-gw"])
    assert not ctx.instances and services_role.applies(ctx)
    assert _retire("lab-cross", "lab-gw").keep == {"vllm-router-pd.service"}
