"""Shadow traffic's bounds and traffic capture's file (issue 33): the profile's `gateway.shadow` and
`gateway.capture`, rendered as they are into the gateway's policy (pdfleet.gateway.policy_spec reads the
same models), so the gateway and the profile share one schema, as `gateway.decider` does."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ShadowSpec(BaseModel):
    """What shadow traffic (issue 33) may spend; shadowing itself is started at run time
    (`POST /admin/shadow`), never by the file, and ends with the gateway, a stop or its deadline.

    A shadow is dropped (counted with the reason) rather than sent when `max_in_flight` shadows are out
    (`concurrency`), when a P/D instance this route lists is queueing more than `pd_waiting_max`
    requests or its queue is unknown (`shadow_queue`), when the primary pool has more than
    `primary_in_flight_max` requests in flight at this gateway (`primary_pressure`), or after
    `unhealthy_after` shadows in a row failed, for `unhealthy_s` (`shadow_unhealthy`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_in_flight: int = Field(8, ge=1, le=4096)
    pd_waiting_max: int | None = Field(4, ge=0)
    primary_in_flight_max: int | None = Field(None, ge=1)
    unhealthy_after: int = Field(3, ge=1)
    unhealthy_s: float = Field(5.0, gt=0)
    max_minutes: float = Field(240.0, gt=0, le=7 * 24 * 60)  # a run asked for longer is refused


class CaptureSpec(BaseModel):
    """Traffic capture (issue 33): the shape of each request (arrival, prompt, effective and output
    tokens, class, remapped prefix-block ids; never any text) as Mooncake trace lines, off while `path`
    is unset. `path` is written 0600; past `max_bytes` it is rotated to `path.1` ... `path.<files-1>`,
    so the capture never holds more than `files` x `max_bytes`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str | None = Field(None, min_length=1)
    max_bytes: int = Field(64 * 1024 * 1024, ge=4096)
    files: int = Field(4, ge=1, le=100)
