"""Rollout stages: per length class, the percent of requests the gateway sends to the disaggregated pool.

One definition for the profile's `gateway.stages` and the gateway's policy file, which is rendered
from it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

LENGTH_CLASSES: tuple[str, ...] = ("short", "long")


class StageSpec(BaseModel):
    """Percent of requests per length class sent to the disaggregated pool in a rollout stage."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    short: int = Field(ge=0, le=100)
    long: int = Field(ge=0, le=100)
