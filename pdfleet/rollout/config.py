"""The controller's configuration file (`/etc/pdfleet/rollout/controller.json`, rendered by roles/rollout):
the profile's plans, gates, stages and SLOs, the gateways' admin URLs, Prometheus, and where state lives.

The admin key is not in it: `admin_key_file` names a 0600 file holding it, read once at start.
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
from pdfleet.model.stages import StageSpec

DEFAULT_CONFIG = Path("/etc/pdfleet/rollout/controller.json")
STATE_DIR = Path("/var/lib/pdfleet/rollout")


class GatewayTarget(BaseModel):
    """One gateway host: its name and the base URL of its admin endpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    admin_url: str = Field(pattern=r"^https?://[^/\s]+$")


class ControllerConfig(BaseModel):
    """Everything the controller needs, validated at start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str = Field(min_length=1)
    rollout: RolloutSpec
    stages: dict[str, StageSpec] = Field(min_length=1)
    initial_stage: str
    slo: dict[str, float]  # the profile's slo: section (ttft_p99_ms, ...)
    gateways: list[GatewayTarget] = Field(min_length=1)
    prometheus_url: str = Field(pattern=r"^https?://[^/\s]+$")
    admin_key_file: str = Field(min_length=1)
    state_dir: str = str(STATE_DIR)
    kv_transfer_metrics: bool = True  # the pools export the connector's KV-transfer histogram
    # which histogram, observed on which role's instances (NIXL: D pulls; Mooncake: P pushes)
    kv_transfer_histogram: str = Field("vllm:nixl_xfer_time_seconds", pattern=r"^vllm:[a-z_]+$")
    kv_transfer_role: Literal["prefill", "decode"] = "decode"
    gateway_timeout_s: float = Field(2.0, gt=0, le=30)
    # a tick's whole measurement; past it every gate is a metrics error (a hung Prometheus is blindness)
    measure_timeout_s: float = Field(5.0, gt=0, le=60)


def load_config(path: Path) -> ControllerConfig:
    """Read and validate the configuration; ValidationError naming the file and key otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read the controller configuration: {exc.strerror}") from None
    except ValueError as exc:
        raise ValidationError(f"{path}: not JSON: {exc}") from None
    try:
        config = ControllerConfig.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError("\n".join(schema_problems(exc, ControllerConfig, path))) from None
    missing = sorted(set(SLO_FIELD.values()) - set(config.slo))
    if missing:
        raise ValidationError(f"{path}: slo: lacks {', '.join(missing)}")
    if config.initial_stage not in config.stages:
        raise ValidationError(f"{path}: initial_stage: {config.initial_stage!r} is not in stages")
    return config


def read_admin_key(path: Path) -> str:
    """The gateways' admin key from its file (which must not be readable by others)."""
    try:
        mode = path.stat().st_mode & 0o077
        key = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read the admin key file: {exc.strerror}") from None
    if mode:
        raise ValidationError(f"{path}: the admin key file is readable by group or others; chmod 0600 it")
    if not key:
        raise ValidationError(f"{path}: the admin key file is empty")
    return key
