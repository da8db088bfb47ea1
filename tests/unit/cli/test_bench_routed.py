"""`invoke bench --pools routed`'s decisions: what the gateway routes by, from its /admin/policy (of the
benched model's group, with several models), and which stage a run goes at (a name the policy has, or the
first stage with the weights asked; one added when none has them); a group's stage set and put back on a
real gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pdfleet.cli.bench_routed import VALIDATE_STAGE, group_view, routing_of, staged, staging
from pdfleet.errors import ValidationError
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.config import GatewayTarget
from pdfleet.rollout.gateways import GatewayClient
from tests.unit.gateway.helpers import ADMIN_KEY, Env, LoopThread

POLICY = {
    "version": 4,
    "stage": "colocated",
    "stage_percent_disagg": {"short": 0, "long": 0},
    "stages": {
        "colocated": {"short": 0, "long": 0},
        "canary-long": {"short": 0, "long": 10},
        "long-prompts": {"short": 0, "long": 100},
    },
    "long_prompt_tokens": 8192,
    "decider": {"threshold_on": "effective", "choice": "round_robin"},
}
LONG = StageSpec(short=0, long=100)


def test_routing_is_the_live_stage_its_weights_and_the_threshold() -> None:
    assert routing_of(POLICY) == {
        "stage": "colocated",
        "stage_percent_disagg": {"short": 0, "long": 0},
        "long_prompt_tokens": 8192,
        "threshold_on": "effective",
        "version": 4,
    }


def test_a_named_stage_must_be_the_policys() -> None:
    assert staging(POLICY, "canary-long")[0] == "canary-long"
    with pytest.raises(ValidationError) as err:
        staging(POLICY, "nope")
    assert str(err.value) == (
        "--stage nope: the gateway's policy has no such stage (its stages: colocated, canary-long, "
        "long-prompts)"
    )


def test_weights_take_the_live_stage_or_the_first_with_them_or_add_one() -> None:
    name, stages = staging(POLICY, None, LONG)
    assert name == "long-prompts" and list(stages) == ["colocated", "canary-long", "long-prompts"]
    assert staging({**POLICY, "stage": "long-prompts"}, None, LONG)[0] == "long-prompts"
    bare = {**POLICY, "stages": {"colocated": {"short": 0, "long": 0}}}
    name, stages = staging(bare, None, LONG)
    assert name == VALIDATE_STAGE and stages == {
        "colocated": StageSpec(short=0, long=0),
        VALIDATE_STAGE: LONG,
    }
    with pytest.raises(ValidationError):
        staging(POLICY, None, None)


GROUPED = {
    **POLICY,
    "groups": {
        "chat-8b": {
            "stage": "canary-long",
            "stage_percent_disagg": {"short": 0, "long": 10},
            "stages": POLICY["stages"],
            "long_prompt_tokens": 4096,
        }
    },
}


def test_a_model_group_routes_by_its_own_stage_and_threshold_and_an_unknown_one_is_refused() -> None:
    view = group_view(GROUPED, "chat-8b")
    assert routing_of(view) == {
        "stage": "canary-long",
        "stage_percent_disagg": {"short": 0, "long": 10},
        "long_prompt_tokens": 4096,
        "threshold_on": "effective",
        "version": 4,
        "group": "chat-8b",
    }
    assert group_view(GROUPED, None) == GROUPED and "group" not in routing_of(group_view(GROUPED, None))
    with pytest.raises(ValidationError) as err:
        group_view(GROUPED, "other")
    assert str(err.value).startswith("the gateway's policy has no model group 'other' (its groups: chat-8b)")


def test_a_stage_for_one_model_group_is_set_on_a_real_gateway_and_put_back_the_others_left(
    tmp_path: Path,
) -> None:
    """`invoke bench --pools routed --stage S` of a profile serving several models: the benched model's
    group runs S for the run (POST /admin/stage with `model`), the other group and the top level do not
    move, and the group's stage is put back after."""
    stages = {"off": {"short": 0, "long": 0}, "long-all": {"short": 0, "long": 100}}

    def models(colo: str, dis: str) -> dict[str, Any]:
        return {
            "llama": {"colocated": [colo], "disagg": dis, "group": "chat-8b"},
            "mini": {"colocated": [colo], "group": "mini"},
        }

    env = Env(tmp_path, models=models, stage="off", stages=stages, groups={"chat-8b": {}, "mini": {}})
    loop = LoopThread()
    try:
        loop.run(env.__aenter__)
        client = GatewayClient(ADMIN_KEY, timeout_s=5.0)
        gw = [GatewayTarget(name="gw", admin_url=env.base)]
        notes: list[str] = []
        with staged(client, gw, "chat-8b", "long-all", None, notes.append) as routing:
            assert routing["stage"] == "long-all" and routing["group"] == "chat-8b"
            assert routing["set_from"] == "off"
            during = client.policy(gw[0])
            assert during["groups"]["chat-8b"]["stage"] == "long-all"
            assert during["groups"]["mini"]["stage"] == "off" and during["stage"] == "off"
        after = client.policy(gw[0])
        assert {g: after["groups"][g]["stage"] for g in ("chat-8b", "mini")} == {
            "chat-8b": "off",
            "mini": "off",
        }
        assert after["stage"] == "off" and after["version"] == 3 and not notes  # set, put back: 1 -> 3
        # a model the gateway has no group for: refused, nothing is set
        with pytest.raises(ValidationError), staged(client, gw, "nope", "long-all"):
            pass
        assert client.policy(gw[0])["version"] == 3
    finally:
        loop.run(lambda: env.__aexit__(None, None, None))
        loop.close()
