"""`invoke bench --pools routed`'s pure decisions: what the gateway routes by, from its /admin/policy, and
which stage a run goes at (a name the policy has, or the first stage with the weights asked; one added
when none has them)."""

from __future__ import annotations

import pytest

from pdfleet.cli.bench_routed import VALIDATE_STAGE, routing_of, staging
from pdfleet.errors import ValidationError
from pdfleet.model.stages import StageSpec

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
