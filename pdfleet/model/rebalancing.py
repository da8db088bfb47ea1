"""The profile's `rollout.rebalance:` section (issue 35): per-pool minimums every move keeps (by hand,
`--to-plan` and automatic), and the rollout controller's automatic mode: off by default; `dry-run` measures
the pools' pressure each tick and records a proposal (one move, between the prefill and decode pools) in the
controller's audit log with the numbers behind it, changing nothing; `on` records it the same way for the
control machine's `invoke rebalance --follow` (or `--proposed`) to carry out, gated as `--to-plan` is (the
controller cannot provision: pdfleet.fleet.proposed), within `act_within_s` of the proposal.

A pool is pressed past its `high` bound and has room below its `low` bound (hysteresis: a figure between the
two neither asks for a host nor gives one). The prefill pool is pressed by its queue time (P95 of
`vllm:request_queue_time_seconds` on its instances); the decode pool by its inter-token latency (P95 of
`vllm:inter_token_latency_seconds`), its busiest instance's KV usage, or preemptions. A proposal needs one
pool pressed and the other with room for `reaction_s` in a row, no proposal in the last `cooldown_s`, and the
giving pool above its minimum.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PoolName = Literal["prefill", "decode", "colocated"]
AUTO_MODES = ("off", "dry-run", "on")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Band(_Model):
    """A figure's hysteresis band: pressed above `high`, with room below `low`."""

    high: float = Field(gt=0)
    low: float = Field(ge=0)

    @model_validator(mode="after")
    def _low_below_high(self) -> Band:
        if self.low >= self.high:
            raise ValueError(
                f"low ({self.low:g}) must be below high ({self.high:g}): the band is the hysteresis"
            )
        return self


class RebalanceSpec(_Model):
    """Minimums per pool, and the automatic mode's bands, reaction time and cool-down."""

    mode: Literal["off", "dry-run", "on"] = "off"
    # unset: 1; never below 1 (a move never empties a pool)
    minimums: dict[PoolName, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    window_s: int = Field(60, ge=2, le=3600)  # the window each figure is measured over
    reaction_s: float = Field(60.0, ge=0, le=3600)  # pressed this long in a row before a proposal
    cooldown_s: float = Field(600.0, ge=0, le=86_400)  # after a proposal, none for this long
    # mode on: a proposal not carried out within this long is skipped (its pressure is no longer measured)
    act_within_s: float = Field(120.0, gt=0, le=86_400)

    @field_validator("mode", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML 1.1 reads an unquoted `on`/`off` as a boolean: `mode: on` means the mode on."""
        if isinstance(value, bool):
            return "on" if value else "off"
        return value

    prefill_queue_p95_ms: Band = Band(high=500.0, low=100.0)
    decode_itl_p95_ms: Band = Band(high=100.0, low=50.0)
    decode_kv_usage: Band = Band(high=0.9, low=0.7)  # the busiest decode instance's, 0..1
    decode_preemptions_per_min: float = Field(0.0, ge=0)  # more than this presses the decode pool
    # set: the colocated pool takes part (its instances' queue time P95); unset: moves between P/D only
    colocated_queue_p95_ms: Band | None = None


def rebalance_problems(spec: RebalanceSpec, pools: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(key path, problem) for minimums of pools the profile does not set, and an automatic mode on a
    profile without both P/D pools (it moves hosts between them)."""
    pools = list(pools)
    for pool in spec.minimums:
        if pool not in pools:
            yield (
                f"rollout.rebalance.minimums.{pool}",
                f"the profile sets no pools.{pool}; pools: {', '.join(pools)}",
            )
    if spec.colocated_queue_p95_ms is not None and "colocated" not in pools:
        yield (
            "rollout.rebalance.colocated_queue_p95_ms",
            f"the profile sets no pools.colocated; pools: {', '.join(pools)}",
        )
    if spec.mode != "off" and not {"prefill", "decode"} <= set(pools):
        yield (
            "rollout.rebalance.mode",
            f"{spec.mode}: the automatic mode moves hosts between the prefill and decode pools, and the "
            "profile does not set both",
        )
