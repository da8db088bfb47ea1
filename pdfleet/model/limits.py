"""Per-key limits as the gateway's policy file and the profile's `gateway.limits` state them (all off by
default): requests per second with a burst, concurrent requests, and maximum prompt tokens per key or
model alias; a key may be restricted to some aliases (`models`) and have limits of its own on one alias
(`per_model`). One definition for both files, as `stages` is; `pdfleet.gateway.limits` enforces them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MIN_RATE = 0.001  # requests per second: one per ~17 minutes, the longest Retry-After a limit can ask
MAX_RATE = 1_000_000.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RateLimits(_Strict):
    """Limits on a stream of requests; an unset field is no limit.

    `concurrent_streams` counts every proxied request from admission until its response ends (a
    non-streaming request holds a GPU slot as long as a stream does).
    """

    # finite and within what a token bucket and a Retry-After header can say: .inf overflowed the bucket
    # (a 500 on every request), 1e-300 asked clients to wait a 301-digit number of seconds
    requests_per_second: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, allow_inf_nan=False)
    burst: int | None = Field(None, ge=1)  # bucket size; default: one second's worth, at least 1
    concurrent_streams: int | None = Field(None, ge=1)
    max_prompt_tokens: int | None = Field(None, ge=1)


class KeyLimits(RateLimits):
    """One key's limits: on all its requests, which aliases it may use (`models`; unset: every one), and
    its own limits on one alias (`per_model`, applied besides the key's)."""

    models: list[str] | None = Field(None, min_length=1)
    per_model: dict[str, RateLimits] | None = None


class ModelLimits(_Strict):
    """One model alias's limits."""

    max_prompt_tokens: int | None = Field(None, ge=1)


class LimitsSpec(_Strict):
    """The policy's `limits:` section: a default for every key, per-key overrides, per-alias limits."""

    default: KeyLimits = KeyLimits()
    keys: dict[str, KeyLimits] = {}
    models: dict[str, ModelLimits] = {}

    def for_key(self, name: str) -> KeyLimits:
        """The key's own limits when listed (each unset field falls back to the default), else the default."""
        own = self.keys.get(name)
        if own is None:
            return self.default
        merged = {k: v if v is not None else getattr(self.default, k) for k, v in own}
        return KeyLimits(**merged)
