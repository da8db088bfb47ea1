"""The live-stage rule: provision keeps the stage a gateway host runs (the rollout controller's), bumps the
version only when the policy's meaning changes, and reads the host's policy with the gateway's own parser."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

import roles.gateway as gateway_role
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.live_stage import live_policy, meaning, model_stages, policy_stage, policy_version
from pdfleet.gateway.live import parse_update, rewritten
from pdfleet.gateway.policy import parse_policy
from pdfleet.model.stages import StageSpec
from pdfleet.ops.base import FakeFacts
from pdfleet.ops.files import File, FileContent
from tests.unit.roles.helpers import deployment

POLICY = Path(gateway_role.POLICY_FILE)


def _rendered(fleet: Deployment, version: int = 1, stage: str = "colocated") -> str:
    ctx = fleet.context(fleet.inventory.hosts["lab-gw"])
    return gateway_role.policy_text(ctx, version, stage, dict(fleet.profile.gateway.stages))


def _controller_step(fleet: Deployment) -> str:
    """The policy file after the rollout controller put the host at a step of its own, version 7."""
    stages = {k: v.model_dump() for k, v in fleet.profile.gateway.stages.items()}
    update = parse_update(
        {
            "version": 7,
            "stage": "long-prompts@2",
            "stages": {**stages, "long-prompts@2": {"short": 0, "long": 50}},
        }
    )
    return rewritten(POLICY, _rendered(fleet), update)


def _gateway_plan(fleet: Deployment, live_text: str | None) -> dict[str, Any]:
    """The policy file the gateway role would install on lab-gw, given the file there now."""
    host = fleet.inventory.hosts["lab-gw"]
    facts = FakeFacts({FileContent(gateway_role.POLICY_FILE): live_text})
    ops = gateway_role.operations(fleet.context(host), facts)
    (policy,) = [op for op in ops if isinstance(op, File) and op.path == gateway_role.POLICY_FILE]
    return dict(yaml.safe_load(policy.content))


def test_the_host_policy_is_read_by_the_gateways_own_parser() -> None:
    fleet = deployment("lab-cross")
    text = _controller_step(fleet)
    live = live_policy(text, POLICY)
    assert live == parse_policy(POLICY, text)
    assert live is not None and (live.version, live.stage) == (7, "long-prompts@2")
    # what the gateway would refuse is no live policy: the initial stage applies
    assert live_policy(None, POLICY) is None and live_policy("just: [text", POLICY) is None
    assert live_policy("version: 1\nstage: x\nstages: {}\n", POLICY) is None
    refused = text.replace("stage: long-prompts@2", "stage: nowhere")
    assert refused != text and live_policy(refused, POLICY) is None


def test_the_stage_is_the_override_else_the_live_one_else_the_initial() -> None:
    fleet = deployment("lab-cross")
    profile = fleet.profile
    live = live_policy(_controller_step(fleet), POLICY)
    assert policy_stage(profile, None, None) == (profile.gateway.stage, dict(profile.gateway.stages))
    stage, stages = policy_stage(profile, live, None)
    assert (stage, stages["long-prompts@2"]) == ("long-prompts@2", StageSpec(short=0, long=50))
    assert policy_stage(profile, live, "colocated") == ("colocated", dict(profile.gateway.stages))


def test_the_version_moves_only_when_the_meaning_does() -> None:
    fleet = deployment("lab-cross")
    live = parse_policy(POLICY, _rendered(fleet, 7))
    same = parse_policy(POLICY, _rendered(fleet, 1))
    assert meaning(same) == meaning(live)
    assert policy_version(fleet.profile, live, lambda v: parse_policy(POLICY, _rendered(fleet, v))) == 7
    assert policy_version(fleet.profile, None, lambda v: same) == fleet.profile.gateway.policy_version
    other = parse_policy(POLICY, _rendered(fleet, 7, "long-prompts"))
    assert policy_version(fleet.profile, live, lambda v: other) == 8
    ahead = fleet.profile.model_copy(
        update={"gateway": fleet.profile.gateway.model_copy(update={"policy_version": 20})}
    )
    assert policy_version(ahead, live, lambda v: other) == 20  # the profile's own bump wins


def test_provision_keeps_the_live_stage_and_bumps_the_version_only_on_a_change() -> None:
    fleet = deployment("lab-cross")
    fresh = _gateway_plan(fleet, None)
    assert (fresh["version"], fresh["stage"]) == (1, "colocated")  # a new host: the initial stage
    on_host = _controller_step(fleet)
    kept = _gateway_plan(fleet, on_host)
    assert (kept["version"], kept["stage"], kept["stages"]["long-prompts@2"]) == (
        7,
        "long-prompts@2",
        {"short": 0, "long": 50},
    )
    # a profile change the policy carries: same stage, one version up
    gw = fleet.profile.gateway.model_copy(update={"long_prompt_tokens": 4096})
    changed = dataclasses.replace(fleet, profile=fleet.profile.model_copy(update={"gateway": gw}))
    bumped = _gateway_plan(changed, on_host)
    assert (bumped["version"], bumped["stage"], bumped["long_prompt_tokens"]) == (8, "long-prompts@2", 4096)
    # the explicit override
    forced = _gateway_plan(dataclasses.replace(fleet, stage_override="colocated"), on_host)
    assert (forced["version"], forced["stage"]) == (8, "colocated")


def test_each_listed_model_is_a_policy_group_that_keeps_its_own_live_stage() -> None:
    fleet = deployment("lab-two-models")
    fresh = _gateway_plan(fleet, None)
    assert {alias: route["group"] for alias, route in fresh["models"].items()} == {
        "llama-3.1-8b": "llama-8b",
        "llama-3.2-1b": "llama-1b",
    }
    # the first model's group follows the top-level stage (what --stage and today's controller set)
    assert fresh["groups"] == {
        "llama-8b": {"long_prompt_tokens": 8192},
        "llama-1b": {"stage": "colocated", "stages": fresh["stages"], "long_prompt_tokens": 4096},
    }
    # the controller moved the 1B model alone (/admin/stage with its model): provision keeps that group's
    # stage and weights, and the top-level stage
    stages = {k: v.model_dump() for k, v in fleet.profile.served[1].gateway.stages.items()}
    body = {"version": 5, "stage": "canary@1", "stages": {**stages, "canary@1": {"short": 0, "long": 10}}}
    on_host = rewritten(POLICY, yaml.safe_dump(fresh), parse_update({**body, "model": "llama-1b"}))
    kept = _gateway_plan(fleet, on_host)
    assert kept["version"] == 5 and kept["stage"] == "colocated"
    assert kept["groups"]["llama-1b"]["stage"] == "canary@1"
    assert kept["groups"]["llama-1b"]["stages"]["canary@1"] == {"short": 0, "long": 10}
    assert "stage" not in kept["groups"]["llama-8b"]
    live = live_policy(on_host, POLICY)
    assert model_stages(fleet.profile, live, None)["llama-1b"] == ("canary@1", kept_stages(kept, "llama-1b"))
    # once the P/D model's group has a stage of its own (a per-model controller), provision keeps it
    body8 = {"version": 6, "stage": "long-prompts", "stages": stages}
    moved = rewritten(POLICY, on_host, parse_update({**body8, "model": "llama-8b"}))
    assert _gateway_plan(fleet, moved)["groups"]["llama-8b"]["stage"] == "long-prompts"
    # --stage sets the top level, which the first model's group follows
    forced = _gateway_plan(dataclasses.replace(fleet, stage_override="all-disagg"), moved)
    assert forced["stage"] == "all-disagg" and "stage" not in forced["groups"]["llama-8b"]
    assert forced["groups"]["llama-1b"]["stage"] == "canary@1"
    named = _gateway_plan(
        dataclasses.replace(fleet, stage_override="all-disagg", stage_model="llama-8b"), moved
    )
    assert named == forced  # --model naming the first model is --stage as before
    # --stage --model llama-1b sets that model's group alone: the top level and the P/D model's group kept
    small = _gateway_plan(
        dataclasses.replace(fleet, stage_override="colocated", stage_model="llama-1b"), moved
    )
    assert (small["version"], small["stage"]) == (7, "colocated")
    assert small["groups"]["llama-1b"]["stage"] == "colocated"
    assert small["groups"]["llama-1b"]["stages"] == fresh["stages"]  # the profile's, no step's weights
    assert small["groups"]["llama-8b"]["stage"] == "long-prompts"
    assert policy_stage(fleet.profile, live, "colocated", "llama-1b") == policy_stage(
        fleet.profile, live, None
    )
    fresh_small = model_stages(fleet.profile, None, "long-prompts", "llama-1b")
    assert fresh_small["llama-8b"] is None and fresh_small["llama-1b"] == (
        "long-prompts",
        kept_stages(fresh, "llama-1b"),
    )
    assert model_stages(deployment("lab-cross").profile, live, None) == {}  # a single-model policy: no groups


def kept_stages(policy: dict[str, Any], group: str) -> dict[str, StageSpec]:
    """A rendered group's stages as StageSpecs."""
    return {k: StageSpec(**v) for k, v in policy["groups"][group]["stages"].items()}
