"""The role registry: every role package, in run order, each providing the whole Role contract."""

from __future__ import annotations

import inspect

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.roles import Role, apt_packages, select_roles
from roles import REGISTRY

HOOKS = ("applies", "operations", "files", "units")


def test_the_registry_runs_drivers_first_and_the_gateway_last() -> None:
    names = [role.NAME for role in REGISTRY]
    assert names == ["base", "gpu_driver", "rdma", "kv_transfer", "vllm", "services", "gateway"]


@pytest.mark.parametrize("role", REGISTRY, ids=lambda r: r.NAME)
def test_every_role_provides_the_whole_contract(role: Role) -> None:
    assert isinstance(role.NAME, str) and isinstance(role.APT_PACKAGES, tuple)
    for hook in HOOKS:
        assert callable(getattr(role, hook)), f"{role.NAME} has no {hook}(ctx)"
        assert list(inspect.signature(getattr(role, hook)).parameters)[0] == "ctx"


def test_apt_packages_of_all_roles_include_base() -> None:
    found = apt_packages(REGISTRY)
    assert "jq" in found and list(found) == sorted(set(found))


def test_select_roles_keeps_registry_order_and_names_unknown_ones() -> None:
    assert [r.NAME for r in select_roles(REGISTRY, "services, base")] == ["base", "services"]
    assert select_roles(REGISTRY, None) == REGISTRY
    with pytest.raises(ValidationError, match="unknown role.*bogus.*available: base"):
        select_roles(REGISTRY, "base,bogus")
