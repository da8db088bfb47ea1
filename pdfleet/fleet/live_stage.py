"""The live-stage rule: provision never moves traffic by itself.

The profile's `gateway.stage` is only the initial stage. On a gateway host that already runs a policy,
provision keeps that policy's stage (the rollout controller's, a step's weights included) unless
`invoke provision --stage S [--model M]` says otherwise (of one model: the first one's is the policy's
top-level stage, another's its policy group's), and bumps the version only when the policy's meaning
changes, so a converged gateway reloads nothing and the controller sees no foreign version. The policy on
the host is read with the gateway's own parser (pdfleet.gateway.policy), so both agree on what it says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import PolicySpec, parse_policy
from pdfleet.model.profile import Profile
from pdfleet.model.stages import StageSpec


def live_policy(text: str | None, source: Path) -> PolicySpec | None:
    """The policy a host runs, from its file's text (None: no file, or one the gateway would refuse)."""
    if text is None:
        return None
    try:
        return parse_policy(source, text)
    except ValidationError:
        return None


def meaning(policy: PolicySpec) -> dict[str, Any]:
    """What a policy says, its version left out: two policies that mean the same need no reload."""
    return policy.model_dump(exclude={"version"})


Staging = tuple[str, dict[str, StageSpec]]  # a stage, and the stages beside it


def policy_stage(
    profile: Profile, live: PolicySpec | None, override: str | None, model: str | None = None
) -> Staging:
    """The stage to render and the stages beside it: the override (when it is the first model's: `model`
    None or its name), else the live one (a rollout step's weights kept), else the profile's initial stage
    (the first model's: the policy's top-level stage)."""
    first = profile.served[0].gateway
    stages = dict(first.stages)
    if override is not None and overridden(profile, model) == profile.served[0].name:
        return override, stages
    if live is None:
        return first.stage, stages
    return _kept(live.stage, live.stages, stages)


def model_stages(
    profile: Profile, live: PolicySpec | None, override: str | None, model: str | None = None
) -> dict[str, Staging | None]:
    """Each listed model's stage and stages (its policy group's), or None where the group follows the
    policy's top-level stage (the first model's, which its `--stage` and a controller without `model`
    set): the model `--stage` names (`model`; None: the first) takes it, the first following the top
    level; otherwise the first model follows the top level unless the host's policy gives its group a
    stage of its own, and the others keep their group's live stage (the controller sets it per model),
    else their initial one. {} for a single-model profile, whose policy has no groups."""
    if not profile.models:
        return {}
    target = None if override is None else overridden(profile, model)
    out: dict[str, Staging | None] = {}
    for index, spec in enumerate(profile.served):
        stages = dict(spec.gateway.stages)
        group = None if live is None else live.groups.get(spec.name)
        if spec.name == target:
            out[spec.name] = None if index == 0 else (str(override), stages)
        elif live is not None and group is not None and group.stage is not None:
            live_stages = group.stages if group.stages is not None else live.stages
            out[spec.name] = _kept(group.stage, live_stages, stages)
        elif index == 0:
            out[spec.name] = None
        else:
            out[spec.name] = (spec.gateway.stage, stages)
    return out


def overridden(profile: Profile, model: str | None) -> str:
    """The name of the model `--stage` sets: `model`, or the first (a single-model profile's only one)."""
    return profile.served[0].name if model is None else model


def _kept(stage: str, live_stages: dict[str, StageSpec], stages: dict[str, StageSpec]) -> Staging:
    """The live stage kept, its weights added when the profile has no stage of that name (a step's)."""
    if stage not in stages and stage in live_stages:
        stages[stage] = live_stages[stage]
    return stage, stages


def policy_version(profile: Profile, live: PolicySpec | None, render: Callable[[int], PolicySpec]) -> int:
    """The version to render: the live one when the policy rendered at it means the same, else one above."""
    if live is None:
        return profile.gateway.policy_version
    if meaning(render(live.version)) == meaning(live):
        return live.version
    return max(live.version + 1, profile.gateway.policy_version)
