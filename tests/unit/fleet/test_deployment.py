"""The one door: every command's Deployment built by one function, complete (hosts, keys, host wheel, stage
override), asking for keys and the wheel only where a selected role installs them on a selected host, and
refusing bad input before anything is asked for."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import (
    DeploymentRequest,
    installs_gateway_side,
    load_deployment,
)
from pdfleet.fleet.roles import select_roles
from pdfleet.fleet.secrets import GatewaySecrets
from roles import REGISTRY
from tests.unit.fleet.helpers import REPO, TEST_SECRETS

LAB = REPO / "inventory" / "lab.yml"


class Calls:
    """Records what the door asked for: the keys (with the files named) and the host wheel."""

    def __init__(self, tmp: Path) -> None:
        self.keys: list[tuple[str, ...]] = []
        self.wheels = 0
        self.wheel = tmp / "pdfleet-0+htest-py3-none-any.whl"

    def secrets(
        self, client: str, admin: str, outside: Mapping[str, str], tls: object, controller: str, named: str
    ) -> GatewaySecrets:
        assert outside == {}  # the lab profiles name no outside alias
        self.keys.append((client, admin, controller, named))
        return TEST_SECRETS

    def host_wheel(self) -> Path:
        self.wheels += 1
        return self.wheel


def _request(calls: Calls, profile: str = "lab-cross", **options: object) -> DeploymentRequest:
    return DeploymentRequest(
        profile,
        LAB,
        REPO / "profiles",
        REPO / "templates",
        **{"roles": tuple(REGISTRY), "secrets": calls.secrets, "host_wheel": calls.host_wheel, **options},  # type: ignore[arg-type]  # options are the request's own fields
    )


def test_a_provision_gets_everything_in_one_call(tmp_path: Path) -> None:
    calls = Calls(tmp_path)
    d = load_deployment(_request(calls, stage="all-disagg"))
    assert [h.name for h in d.hosts] == list(d.inventory.hosts)
    assert (
        d.gateway_secrets == TEST_SECRETS and d.host_wheel == calls.wheel and d.stage_override == "all-disagg"
    )
    gw = d.profile.gateway
    files = (gw.client_key_file, gw.admin_key_file, gw.controller_key_file, gw.keys_dir)
    assert calls.keys == [files] and calls.wheels == 1
    ctx = d.context(d.hosts[0])
    assert (ctx.gateway_secrets, ctx.host_wheel, ctx.stage_override) == (
        TEST_SECRETS,
        calls.wheel,
        "all-disagg",
    )


def test_stage_names_its_model_the_only_one_by_default(tmp_path: Path) -> None:
    """--stage with --model: the model whose stage it sets reaches every host's context; a single-model
    profile's is its only model, named or not."""
    calls = Calls(tmp_path)
    two = load_deployment(_request(calls, "lab-two-models", stage="long-prompts", stage_model="llama-1b"))
    ctx = two.context(two.hosts[0])
    assert (ctx.stage_override, ctx.stage_model) == ("long-prompts", "llama-1b")
    for model in (None, "llama-3-1-8b"):
        one = load_deployment(_request(calls, stage="colocated", stage_model=model))
        assert (one.stage_override, one.stage_model) == ("colocated", "llama-3-1-8b")
    assert load_deployment(_request(calls)).stage_model is None


def test_keys_and_wheel_only_where_a_selected_role_installs_them_on_a_selected_host(tmp_path: Path) -> None:
    calls = Calls(tmp_path)
    pool_host = load_deployment(_request(calls, limit="lab-d1"))
    assert [h.name for h in pool_host.hosts] == ["lab-d1"]
    assert (pool_host.gateway_secrets, pool_host.host_wheel) == (None, None)
    no_gateway_role = load_deployment(_request(calls, roles=select_roles(REGISTRY, "base,services")))
    assert no_gateway_role.gateway_secrets is None
    assert calls.keys == [] and calls.wheels == 0  # never asked: nothing read or generated
    read_only = load_deployment(_request(calls, roles=(), secrets=None, host_wheel=None))
    assert (read_only.roles, read_only.gateway_secrets, read_only.host_wheel) == ((), None, None)


def test_the_decisions_follow_the_topology() -> None:
    d = load_deployment(DeploymentRequest("lab-cross", LAB, REPO / "profiles", REPO / "templates"))
    hosts = d.inventory.hosts
    gateway, rollout = select_roles(REGISTRY, "gateway"), select_roles(REGISTRY, "rollout")
    assert d.topology.controller is not None and d.topology.controller.host.name == "lab-gw"
    assert installs_gateway_side(gateway, d.topology, [hosts["lab-gw"]])
    assert installs_gateway_side(rollout, d.topology, [hosts["lab-gw"]])  # the controller's admin key
    # a sim pool host installs the wheel from the index; the gateway role never runs there
    assert not installs_gateway_side(gateway, d.topology, [hosts["lab-p1"], hosts["lab-colo1"]])
    assert not installs_gateway_side(select_roles(REGISTRY, "base,services"), d.topology, hosts.values())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stage": "no-such-stage"}, "--stage: 'no-such-stage' is not a stage in gateway.stages"),
        ({"limit": "no-such-host"}, "no-such-host"),
        ({"profile": "no-such-profile"}, "no-such-profile"),
        (
            {"stage_model": "llama-3-1-8b"},
            "--model: it names the model whose stage --stage sets; give --stage",
        ),
        ({"stage": "colocated", "stage_model": "x"}, "--stage: .*lab-cross.yml: no model 'x' \\(--model\\)"),
        (
            {"profile": "lab-two-models", "stage": "colocated"},
            "--stage: .*several models; name one \\(--model\\): llama-8b, llama-1b",
        ),
        (
            {"profile": "lab-two-models", "stage": "nope", "stage_model": "llama-1b"},
            "--stage: 'nope' is not a stage in models\\[1\\].gateway.stages",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_is_asked_for(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    calls = Calls(tmp_path)
    with pytest.raises(ValidationError, match=message):
        load_deployment(_request(calls, **options))
    assert calls.keys == [] and calls.wheels == 0
