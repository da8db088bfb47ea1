"""The controller's configuration file (`/etc/pdfleet/rollout/controller.json`, rendered by roles/rollout):
the gateways' admin URLs, Prometheus and where state lives, and per model (`models:`, in the profile's
order) its plans, gates, stages and SLOs, the gateway group it stages and the `model` label of its series.
Each model is rolled out on its own: `ControllerConfig` is one model's view of the file.

The controller's key is not in it: `stage_key_file` names a 0600 file holding it (the gateways' stage-only
key, gateway.controller_key_file in the profile: it may read the policy and set the stage, nothing else),
read once at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.model.rollout import SLO_FIELD, RolloutSpec
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.served import NAME_PATTERN
from pdfleet.model.stages import StageSpec

DEFAULT_CONFIG = Path("/etc/pdfleet/rollout/controller.json")
STATE_DIR = Path("/var/lib/pdfleet/rollout")


class GatewayTarget(BaseModel):
    """One gateway host: its name and the base URL of its admin endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    admin_url: str = Field(pattern=r"^https?://[^/\s]+$")


class _Shared(BaseModel):
    """What every model's controller shares: the gateways, Prometheus, the stage key, the state dir."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(min_length=1)
    gateways: list[GatewayTarget] = Field(min_length=1)
    prometheus_url: str = Field(pattern=r"^https?://[^/\s]+$")
    stage_key_file: str = Field(min_length=1)
    # the CA an https admin_url's certificate chains to (None: the system's trust; plain http needs none)
    gateway_ca_file: str | None = Field(None, min_length=1)
    state_dir: str = str(STATE_DIR)
    gateway_timeout_s: float = Field(2.0, gt=0, le=30)
    # a tick's whole measurement; past it every gate is a metrics error (a hung Prometheus is blindness)
    measure_timeout_s: float = Field(5.0, gt=0, le=60)


class ModelControl(BaseModel):
    """One model's part of the file: what its rollouts follow and where its stage lives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)  # the profile's model name: --model, the state subdirectory
    group: str | None = Field(None, min_length=1)  # its gateway policy group; None: the top-level stage
    model: str | None = Field(None, min_length=1)  # the `model` label its series carry; None: sum all
    rollout: RolloutSpec
    stages: dict[str, StageSpec] = Field(min_length=1)
    initial_stage: str
    slo: dict[str, float]  # the model's slo: section (ttft_p99_ms, ...)
    kv_transfer_metrics: bool = True  # the pools export the connector's KV-transfer histogram
    # which histogram, observed on which role's instances (NIXL: D pulls; Mooncake: P pushes)
    kv_transfer_histogram: str = Field("vllm:nixl_xfer_time_seconds", pattern=r"^vllm:[a-z_]+$")
    kv_transfer_role: Literal["prefill", "decode"] = "decode"


class ControllerFile(_Shared):
    """controller.json as rendered: the shared keys and every model's part, in the profile's order."""

    models: list[ModelControl] = Field(min_length=1)


class ControllerConfig(_Shared):
    """One model's controller: the shared keys and that model's part (`name` None: a controller built
    directly, its state in state_dir itself)."""

    name: str | None = None
    group: str | None = None
    model: str | None = None
    rollout: RolloutSpec
    stages: dict[str, StageSpec] = Field(min_length=1)
    initial_stage: str
    slo: dict[str, float]
    kv_transfer_metrics: bool = True
    kv_transfer_histogram: str = Field("vllm:nixl_xfer_time_seconds", pattern=r"^vllm:[a-z_]+$")
    kv_transfer_role: Literal["prefill", "decode"] = "decode"


def load_configs(path: Path) -> list[ControllerConfig]:
    """Read and validate the file: one configuration per model, in its order; ValidationError naming
    the file and key otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read the controller configuration: {exc.strerror}") from None
    except ValueError as exc:
        raise ValidationError(f"{path}: not JSON: {exc}") from None
    if isinstance(data, dict) and "models" not in data and "rollout" in data:
        raise ValidationError(
            f"{path}: models: missing (a file from before rollouts went by model); "
            "run invoke provision to render it again"
        )
    if isinstance(data, dict) and "admin_key_file" in data and "stage_key_file" not in data:
        raise ValidationError(
            f"{path}: admin_key_file: renamed stage_key_file (it names the stage-only key's file); "
            "run invoke provision to render it again"
        )
    try:
        doc = ControllerFile.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError("\n".join(schema_problems(exc, ControllerFile, path))) from None
    problems = _model_problems(doc.models)
    if problems:
        raise ValidationError("\n".join(f"{path}: {p}" for p in problems))
    shared = doc.model_dump(exclude={"models"})
    return [ControllerConfig.model_validate({**shared, **m.model_dump()}) for m in doc.models]


def _model_problems(models: list[ModelControl]) -> list[str]:
    """A model named twice, a group staged by two models, an SLO lacking a bound, an initial stage
    that is not a stage: each with its key path."""
    problems = []
    seen: dict[str, set[str | None]] = {"name": set(), "group": set()}
    for i, m in enumerate(models):
        for key in ("name", "group"):
            value = getattr(m, key)
            if value in seen[key]:
                shown = "null (the policy's top-level stage)" if value is None else repr(value)
                problems.append(f"models[{i}].{key}: {shown} is given to two models")
            seen[key].add(value)
        missing = sorted(set(SLO_FIELD.values()) - set(m.slo))
        if missing:
            problems.append(f"models[{i}].slo: lacks {', '.join(missing)}")
        if m.initial_stage not in m.stages:
            problems.append(f"models[{i}].initial_stage: {m.initial_stage!r} is not in stages")
    return problems


def read_admin_key(path: Path) -> str:
    """The gateways' admin key from its file (which must not be readable by others)."""
    return read_key_file(path, "admin key")


def read_key_file(path: Path, what: str) -> str:
    """A gateway key (`what`: which, for the errors) from its file, which must not be readable by others;
    errors never hold the key."""
    try:
        mode = path.stat().st_mode & 0o077
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read the {what} file: {exc.strerror}") from None
    if mode:
        raise ValidationError(f"{path}: the {what} file is readable by group or others; chmod 0600 it")
    if not key:
        raise ValidationError(f"{path}: the {what} file is empty")
    return key
