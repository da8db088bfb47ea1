"""`/admin/shadow` (admin key): start, stop and read a shadow run (issue 33).

`POST {"action": "start", "stage": S, "share": N, "minutes": M[, "model": GROUP]}` starts one (replacing a
running one): S is a stage of the policy (of the model group's stages when `model` names one), whose
percentage for a class above 0 selects that class; N the percent of sticky buckets shadowed (1-100);
M its length (at most the policy's `shadow.max_minutes`); optional `classes` narrow it to some of the
stage's classes, and a `tag` names who started it (the rollout controller's shadow step).
`POST {"action": "stop"[, "tag": T]}` ends it (with a tag: only a run carrying that tag). `GET` shows
the running run, the last one and the shadows in flight. The run lives in the gateway's memory:
a restart ends it (shadowing is off by default).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.gateway.policy import ActivePolicy, group_staging
from pdfleet.gateway.shadow import Shadowing, ShadowRun
from pdfleet.model.rollout import LengthClass
from pdfleet.model.schema_errors import schema_problems


class ShadowRequest(BaseModel):
    """What the operator sends."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    action: Literal["start", "stop"]
    stage: str | None = Field(None, min_length=1, max_length=200)
    share: int | None = Field(None, ge=1, le=100)
    minutes: float | None = Field(None, gt=0)
    model: str | None = Field(None, min_length=1, max_length=64)
    classes: list[LengthClass] | None = Field(None, min_length=1)
    tag: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:/@+-]+$")


def parse_request(body: Any) -> ShadowRequest:
    """The body as a ShadowRequest, or a ValidationError naming the key."""
    if not isinstance(body, dict):
        raise ValidationError('the body must be a JSON object: {"action": "start"|"stop", ...}')
    try:
        req = ShadowRequest.model_validate(body)
    except PydanticValidationError as exc:
        raise ValidationError("; ".join(schema_problems(exc, ShadowRequest, Path("request body")))) from None
    if req.action == "start" and (req.stage is None or req.share is None or req.minutes is None):
        raise ValidationError("request body: start needs stage, share (1-100) and minutes")
    return req


def run_of(policy: ActivePolicy, req: ShadowRequest) -> ShadowRun:
    """The run a start asks for, checked against the active policy (stage, model, minutes)."""
    spec = policy.spec
    assert req.stage is not None and req.share is not None and req.minutes is not None
    labels = {r.model for r in policy.routes.values() if r.staging is not None}
    if req.model is not None and req.model not in labels:
        raise ValidationError(
            f"model: {req.model!r} routes nothing here (models: {', '.join(sorted(labels)) or 'none'})"
        )
    group = req.model if req.model is not None and req.model in spec.groups else None
    stages = group_staging(spec, group).stages
    if req.stage not in stages:
        raise ValidationError(f"stage: {req.stage!r} is not a stage; stages are: {', '.join(stages)}")
    weights = stages[req.stage]
    if weights.short == 0 and weights.long == 0:
        raise ValidationError(
            f"stage: {req.stage!r} moves no class to P/D (0% short and long): nothing to shadow"
        )
    for cls in req.classes or ():
        if getattr(weights, cls) == 0:
            raise ValidationError(f"classes: stage {req.stage!r} moves 0% of {cls}: nothing to shadow")
    if req.minutes > spec.shadow.max_minutes:
        raise ValidationError(
            f"minutes: {req.minutes:g} is past the policy's shadow.max_minutes ({spec.shadow.max_minutes:g})"
        )
    classes = None if req.classes is None else tuple(req.classes)
    until = time.monotonic() + req.minutes * 60
    return ShadowRun(req.stage, weights, req.share, until, req.model, classes=classes, tag=req.tag)


def apply_request(shadowing: Shadowing, policy: ActivePolicy, body: Any) -> None:
    """Start or stop the run a POST's parsed body asks for (ValidationError when it is not valid); a stop
    with a tag stops only the run of that tag."""
    req = parse_request(body)
    run = run_of(policy, req) if req.action == "start" else None
    running = shadowing.run
    if run is None and (req.tag is None or (running is not None and running.tag == req.tag)):
        shadowing.stop("stopped")
    elif run is not None:
        shadowing.start(run)
