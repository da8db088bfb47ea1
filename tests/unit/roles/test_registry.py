"""The role registry: every role package, in run order, each providing the whole Role contract."""

from __future__ import annotations

import inspect

import pytest

from pdfleet.fleet.roles import Role
from roles import REGISTRY

HOOKS = ("applies", "operations", "files", "units")


def test_the_registry_runs_drivers_first_then_the_gateway_monitoring_and_the_rollout_controller() -> None:
    names = [role.NAME for role in REGISTRY]
    assert names == [
        "base",
        "gpu_driver",
        "rdma",
        "kv_transfer",
        "vllm",
        "services",
        "gateway",
        "monitoring",
        "rollout",
    ]


@pytest.mark.parametrize("role", REGISTRY, ids=lambda r: r.NAME)
def test_every_role_provides_the_whole_contract(role: Role) -> None:
    assert isinstance(role.NAME, str) and isinstance(role.APT_PACKAGES, tuple)
    for hook in HOOKS:
        assert callable(getattr(role, hook)), f"{role.NAME} has no {hook}(ctx)"
        assert list(inspect.signature(getattr(role, hook)).parameters)[0] == "ctx"
