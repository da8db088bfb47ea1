"""The live-stage rule: provision never moves traffic by itself.

The profile's `gateway.stage` is only the initial stage. On a gateway host that already runs a policy,
provision keeps that policy's stage (the rollout controller's, a step's weights included) unless
`invoke provision --stage S` says otherwise, and bumps the version only when the policy's meaning
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


def policy_stage(
    profile: Profile, live: PolicySpec | None, override: str | None
) -> tuple[str, dict[str, StageSpec]]:
    """The stage to render and the stages beside it: the override, else the live one (a rollout step's
    weights kept), else the profile's initial stage (the first model's: the policy's one stage)."""
    first = profile.served[0].gateway
    stages = dict(first.stages)
    if override is not None:
        return override, stages
    if live is None:
        return first.stage, stages
    if live.stage not in stages:
        stages[live.stage] = live.stages[live.stage]
    return live.stage, stages


def policy_version(profile: Profile, live: PolicySpec | None, render: Callable[[int], PolicySpec]) -> int:
    """The version to render: the live one when the policy rendered at it means the same, else one above."""
    if live is None:
        return profile.gateway.policy_version
    if meaning(render(live.version)) == meaning(live):
        return live.version
    return max(live.version + 1, profile.gateway.policy_version)
