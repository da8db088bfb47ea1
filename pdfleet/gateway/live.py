"""`POST /admin/stage` (admin key): the rollout controller sets the live stage; the gateway writes it into
its own policy file (through pdfleet.gateway.policy, atomically, 0600) and reloads, so a restart keeps
what the controller applied.

The body is `{"version": N, "stage": NAME, "stages": {NAME: {short, long}, ...}}`. Only those three keys
of the file change; everything else provision rendered stays. The version must rise: the same version
with the same stage and stages is a no-op (a retry), a lower one or the same one with other content is
refused (409), so two writers can never leave gateways reporting one version for two policies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import PolicySpec, read_policy_bytes, with_stage, write_policy
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.stages import StageSpec


class StageUpdate(BaseModel):
    """What the controller sends."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    version: int = Field(ge=1)
    stage: str = Field(min_length=1, max_length=200)
    stages: dict[str, StageSpec] = Field(min_length=1, max_length=64)


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


def is_noop(active: PolicySpec, update: StageUpdate) -> bool:
    """The update is what is already active (a retry after a lost answer)."""
    return (active.version, active.stage, active.stages) == (update.version, update.stage, update.stages)


def rewritten(source: Path, text: str, update: StageUpdate) -> str:
    """The policy file's text with the update's version, stage and stages (policy.with_stage)."""
    return with_stage(source, text, update.version, update.stage, update.stages)


def apply_update(path: Path, update: StageUpdate) -> None:
    """Rewrite the policy file on disk with the update, atomically (0600)."""
    write_policy(path, rewritten(path, read_policy_bytes(path).decode("utf-8", "replace"), update))
