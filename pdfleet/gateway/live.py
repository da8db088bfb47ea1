"""`POST /admin/stage` (admin key): the rollout controller sets the live stage; the gateway writes it into
its own policy file (through pdfleet.gateway.policy, atomically, 0600) and reloads, so a restart keeps
what the controller applied.

The body is `{"version": N, "stage": NAME, "stages": {NAME: {short, long}, ...}}`, optionally with
`"model": GROUP`: then that model group's stage and stages change (`groups.GROUP` in the file) and every
other group and the top level stay; without it the top-level stage and stages change, as before groups.
Only those keys and the version change; everything else provision rendered stays. The version must
rise: the same version with the same stage and stages is a no-op (a retry), a lower one or the same one
with other content is refused (409), so two writers can never leave gateways reporting one version for
two policies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import PolicySpec, group_staging, read_policy_bytes, with_stage, write_policy
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.stages import StageSpec


class StageUpdate(BaseModel):
    """What the controller sends."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: int = Field(ge=1)
    stage: str = Field(min_length=1, max_length=200)
    stages: dict[str, StageSpec] = Field(min_length=1, max_length=64)
    model: str | None = Field(None, min_length=1, max_length=64)  # a model group; None: the top level


class StageConflict(ValidationError):
    """The update's version does not rise above the active one."""


def parse_update(body: Any) -> StageUpdate:
    """The request body as a StageUpdate, or ValidationError naming the key."""
    if not isinstance(body, dict):
        raise ValidationError("the body must be a JSON object with version, stage and stages")
    try:
        update = StageUpdate.model_validate(body)
    except PydanticValidationError as exc:
        raise ValidationError("; ".join(schema_problems(exc, StageUpdate, Path("request body")))) from None
    if update.stage not in update.stages:
        raise ValidationError(f"request body: stage: {update.stage!r} is not in stages")
    return update


def unknown_model(active: PolicySpec, update: StageUpdate) -> str | None:
    """Why the update's model cannot be set (no such group in the policy), or None."""
    if update.model is None or update.model in active.groups:
        return None
    known = ", ".join(active.groups) or "none: this policy has no groups"
    return f"model {update.model!r} is not a model group of this gateway's policy (groups: {known})"


def is_noop(active: PolicySpec, update: StageUpdate) -> bool:
    """The update is what is already active (a retry after a lost answer)."""
    if update.model is None:
        now = (active.version, active.stage, active.stages)
    else:
        staging = group_staging(active, update.model)
        now = (active.version, staging.stage, dict(staging.stages))
    return now == (update.version, update.stage, update.stages)


def rewritten(source: Path, text: str, update: StageUpdate) -> str:
    """The policy file's text with the update's version, stage and stages (policy.with_stage)."""
    return with_stage(source, text, update.version, update.stage, update.stages, update.model)


def apply_update(path: Path, update: StageUpdate) -> None:
    """Rewrite the policy file on disk with the update, atomically (0600)."""
    write_policy(path, rewritten(path, read_policy_bytes(path).decode("utf-8", "replace"), update))
