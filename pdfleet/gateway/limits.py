"""Per-key limits: requests per second (a token bucket), concurrent requests, prompt tokens per key/alias.

The policy file's `limits:` section says what is allowed (`pdfleet.model.limits.LimitsSpec`, off by
default); the `Limiter`
holds what is used and outlives a policy reload: in-flight requests stay counted, and a bucket keeps
its level (capped at a lower new burst) instead of refilling to a burst-allowing state.
Keys are named by their `name` in the keys file, never by the key or its hash.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pdfleet.model.limits import KeyLimits, LimitsSpec


def check_limit_names(limits: LimitsSpec, key_names: set[str], aliases: set[str], source: str) -> list[str]:
    """Problems with names in `limits:` that are not a key name in the keys file or not a model alias."""
    out = []
    for name in limits.keys:
        if name not in key_names:
            known = ", ".join(sorted(key_names))
            out.append(f"{source}: limits.keys.{name}: no key of that name in the keys file (names: {known})")
    for alias in limits.models:
        if alias not in aliases:
            out.append(f"{source}: limits.models.{alias}: not a model alias (aliases: {', '.join(aliases)})")
    return out


@dataclass
class Bucket:
    """A token bucket: `level` tokens now (at most `burst`), refilled at `rate` per second."""

    rate: float
    burst: float
    level: float
    stamp: float

    def refill(self, now: float) -> None:
        """Add what accrued since the last look."""
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    def take(self, now: float) -> float:
        """Take one token: 0.0 when granted, else the seconds until one is available."""
        self.refill(now)
        if self.level >= 1.0:
            self.level -= 1.0
            return 0.0
        return (1.0 - self.level) / self.rate


@dataclass(frozen=True)
class Rejection:
    """Why a request is refused: reason (rate | concurrency), message, seconds to wait."""

    reason: str
    message: str
    retry_after_s: int


def _burst(lim: KeyLimits) -> float:
    assert lim.requests_per_second is not None
    return float(lim.burst if lim.burst is not None else max(1, math.ceil(lim.requests_per_second)))


class Limiter:
    """What each key uses now: its bucket and its requests in flight (counted with or without a limit)."""

    def __init__(self, spec: LimitsSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.spec = spec
        self.buckets: dict[str, Bucket] = {}
        self.in_flight: dict[str, int] = {}
        self._limits: dict[str, KeyLimits] = {}

    def configure(self, spec: LimitsSpec) -> None:
        """Apply new limits (a reload): buckets keep their level, capped at the new burst; in-flight
        counts are untouched; a key no longer rate-limited drops its bucket."""
        now = self.clock()
        self.spec = spec
        self._limits = {}
        for name, bucket in list(self.buckets.items()):
            lim = spec.for_key(name)
            if lim.requests_per_second is None:
                del self.buckets[name]
                continue
            bucket.refill(now)  # what accrued under the old rate
            bucket.rate, bucket.burst = lim.requests_per_second, _burst(lim)
            bucket.level = min(bucket.level, bucket.burst)

    def limits(self, name: str) -> KeyLimits:
        """The key's effective limits (cached per configuration)."""
        found = self._limits.get(name)
        if found is None:
            found = self._limits[name] = self.spec.for_key(name)
        return found

    def acquire(self, name: str) -> Rejection | None:
        """Admit one request of key `name` (then count it in flight) or say why not; the caller must
        `release(name)` exactly once after an admitted request ends, however it ends."""
        lim = self.limits(name)
        held = self.in_flight.get(name, 0)
        if lim.concurrent_streams is not None and held >= lim.concurrent_streams:
            return Rejection(
                "concurrency",
                f"key {name!r} already has {held} requests in flight, its limit is "
                f"{lim.concurrent_streams}; retry when one ends",
                1,
            )
        if lim.requests_per_second is not None:
            now = self.clock()
            bucket = self.buckets.get(name)
            if bucket is None:
                burst = _burst(lim)
                bucket = self.buckets[name] = Bucket(lim.requests_per_second, burst, burst, now)
            wait = bucket.take(now)
            if wait > 0:
                return Rejection(
                    "rate",
                    f"key {name!r} is over its limit of {lim.requests_per_second:g} requests per second "
                    f"(burst {bucket.burst:g}); retry in {wait:.2f} s",
                    max(1, math.ceil(wait)),
                )
        self.in_flight[name] = held + 1
        return None

    def release(self, name: str) -> None:
        """One admitted request of key `name` ended."""
        held = self.in_flight.get(name, 0) - 1
        if held > 0:
            self.in_flight[name] = held
        else:
            self.in_flight.pop(name, None)


def prompt_limit(spec: LimitsSpec, key_limits: KeyLimits, alias: str) -> tuple[int, str] | None:
    """The tightest prompt-token limit for this key and alias, and whose it is, or None."""
    found: list[tuple[int, str]] = []
    if key_limits.max_prompt_tokens is not None:
        found.append((key_limits.max_prompt_tokens, "key"))
    model = spec.models.get(alias)
    if model is not None and model.max_prompt_tokens is not None:
        found.append((model.max_prompt_tokens, f"model {alias!r}"))
    return min(found) if found else None


def limits_summary(limiter: Limiter) -> Mapping[str, object]:
    """What /admin/policy shows of the limits: the spec and the in-flight counts per key name."""
    return {"spec": limiter.spec.model_dump(exclude_defaults=True), "in_flight": dict(limiter.in_flight)}
