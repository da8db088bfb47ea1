"""Per-key limits: requests per second (a token bucket), concurrent requests, prompt tokens per key/alias,
which aliases a key may use, and a key's own limits on one alias (counted in a slot `key/alias` of its own,
besides the key's).

The policy file's `limits:` section says what is allowed (`pdfleet.model.limits.LimitsSpec`, off by
default); the `Limiter`
holds what is used and outlives a policy reload: in-flight requests stay counted, and a bucket keeps
its level (capped at a lower new burst) instead of refilling to a burst-allowing state.
Keys are named by their `name` in the keys file, never by the key or its hash. The admit/check functions
at the end turn a refusal into the request's error (429 with Retry-After, 403, 400) and count it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pdfleet.gateway.errors import Reject
from pdfleet.gateway.metrics import GatewayMetrics
from pdfleet.model.limits import KeyLimits, LimitsSpec, RateLimits


def check_limit_names(limits: LimitsSpec, key_names: set[str], aliases: set[str], source: str) -> list[str]:
    """Problems with names in `limits:` that are not a key name in the keys file or not a model alias."""
    return check_limit_keys(limits, key_names, source) + check_limit_aliases(limits, aliases, source)


def check_limit_keys(limits: LimitsSpec, key_names: set[str], source: str) -> list[str]:
    """Problems with key names in `limits:` the keys file does not have (known only once it is read)."""
    known = ", ".join(sorted(key_names))
    return [
        f"{source}: limits.keys.{name}: no key of that name in the keys file (names: {known})"
        for name in limits.keys
        if name not in key_names
    ]


def check_limit_aliases(limits: LimitsSpec, aliases: set[str], source: str) -> list[str]:
    """Problems with alias names in `limits:` that are not one of the policy's aliases (checked with the
    policy file itself, so a rendered policy naming one is refused before it is written)."""
    out = []
    shown = ", ".join(sorted(aliases))
    for alias in limits.models:
        if alias not in aliases:
            out.append(f"{source}: limits.models.{alias}: not a model alias (aliases: {shown})")
    owners = {"limits.default": limits.default, **{f"limits.keys.{k}": v for k, v in limits.keys.items()}}
    for where, lim in owners.items():
        for i, alias in enumerate(lim.models or ()):
            if alias not in aliases:
                out.append(
                    f"{source}: {where}.models[{i}]: {alias!r} is not a model alias (aliases: {shown})"
                )
        for alias in lim.per_model or {}:
            if alias not in aliases:
                out.append(f"{source}: {where}.per_model.{alias}: not a model alias (aliases: {shown})")
    return out


# between key and alias in a slot's name: a control character, which no key name (the YAML loader refuses
# them in every file pdfleet reads) can hold, so a slot never shares a key's counts
SLOT_SEP = "\x1f"


def slot(key: str, alias: str) -> str:
    """The limiter's slot of a key's requests to one alias (its per_model limits count there)."""
    return f"{key}{SLOT_SEP}{alias}"


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


def _burst(lim: RateLimits) -> float:
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
        self._slot_of: dict[str, tuple[str, str]] = {}  # a per_model slot's (key, alias)
        self.last_used: dict[str, float] = {}  # key name -> when it last asked (epoch s; /admin/keys)

    def configure(self, spec: LimitsSpec) -> None:
        """Apply new limits (a reload): buckets keep their level, capped at the new burst; in-flight
        counts are untouched; a key no longer rate-limited drops its bucket."""
        now = self.clock()
        self.spec = spec
        self._limits = {}
        for name, bucket in list(self.buckets.items()):
            owner = self._slot_of.get(name)
            lim: RateLimits = spec.for_key(name)
            if owner is not None:
                lim = (spec.for_key(owner[0]).per_model or {}).get(owner[1]) or RateLimits()
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

    def model_limits(self, key: str, alias: str) -> RateLimits | None:
        """The key's own limits on one alias (`per_model`), or None."""
        return (self.limits(key).per_model or {}).get(alias)

    def acquire_model(self, key: str, alias: str) -> tuple[str | None, Rejection | None]:
        """Admit one request of `key` to `alias` under the key's per_model limits for it: (the slot to
        `release` once it ends, or None when the key has none for the alias; why not)."""
        lim = self.model_limits(key, alias)
        if lim is None:
            return None, None
        name = slot(key, alias)
        self._slot_of[name] = (key, alias)
        return name, self._take(name, lim, f"key {key!r} on model {alias!r}")

    def acquire(self, name: str) -> Rejection | None:
        """Admit one request of key `name` (then count it in flight) or say why not; the caller must
        `release(name)` exactly once after an admitted request ends, however it ends."""
        self.last_used[name] = time.time()
        return self._take(name, self.limits(name), f"key {name!r}")

    def _take(self, name: str, lim: RateLimits, who: str) -> Rejection | None:
        """Count one request in slot `name` under `lim`, or say why not (`who` heads the message)."""
        held = self.in_flight.get(name, 0)
        if lim.concurrent_streams is not None and held >= lim.concurrent_streams:
            return Rejection(
                "concurrency",
                f"{who} already has {held} requests in flight, its limit is "
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
                    f"{who} is over its limit of {lim.requests_per_second:g} requests per second "
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
    own = (key_limits.per_model or {}).get(alias)
    if own is not None and own.max_prompt_tokens is not None:
        found.append((own.max_prompt_tokens, f"key on model {alias!r}"))
    model = spec.models.get(alias)
    if model is not None and model.max_prompt_tokens is not None:
        found.append((model.max_prompt_tokens, f"model {alias!r}"))
    return min(found) if found else None


def limits_summary(limiter: Limiter) -> Mapping[str, object]:
    """What /admin/policy shows of the limits: the spec and the in-flight counts per key name (a key's slot
    on one alias as `key/alias`)."""
    in_flight = {name.replace(SLOT_SEP, "/"): n for name, n in limiter.in_flight.items()}
    return {"spec": limiter.spec.model_dump(exclude_defaults=True), "in_flight": in_flight}


def model_refusal(key_limits: KeyLimits, key: str, alias: str) -> str | None:
    """Why key `key` may not use `alias` (its `models` list leaves it out), or None."""
    allowed = key_limits.models
    if allowed is None or alias in allowed:
        return None
    return f"the key {key!r} may not use model {alias!r}; its models: {', '.join(allowed)}"


# ---- enforcing them on a request: the gateway's own errors -------------------------------------------


def check_prompt_limit(
    spec: LimitsSpec, limiter: Limiter, key: str, alias: str, tokens: int, endpoint: str = "chat"
) -> None:
    """400 when the prompt estimate is over the key's or the alias's max_prompt_tokens."""
    found = prompt_limit(spec, limiter.limits(key), alias)
    if found is not None and tokens > found[0]:
        limit, whose = found
        raise Reject(
            400,
            f"the prompt is about {tokens} tokens (the gateway's estimate); the limit for this {whose} "
            f"is {limit} prompt tokens. Shorten the prompt.",
            code="prompt_too_long",
            param="prompt" if endpoint == "completions" else "messages",
        )


def admit_key(limiter: Limiter, name: str, m: GatewayMetrics) -> None:
    """Count the key's request in flight, or a 429 with Retry-After when it is over a limit."""
    _refuse_over_limit(limiter.acquire(name), name, m)


def admit_model(limiter: Limiter, key: str, alias: str, m: GatewayMetrics) -> str | None:
    """403 when the key may not use the alias; else count the request in the key's slot for the alias
    (the slot to release, None without per_model limits for it), or a 429 when it is over them."""
    refusal = model_refusal(limiter.limits(key), key, alias)
    if refusal is not None:
        m.child(m.limit_rejections, key, "model").inc()
        raise Reject(403, refusal, code="model_not_allowed", param="model")
    name, rejected = limiter.acquire_model(key, alias)
    _refuse_over_limit(rejected, key, m)
    return name


def _refuse_over_limit(rejected: Rejection | None, name: str, m: GatewayMetrics) -> None:
    """A 429 with Retry-After for a request over a limit, counted by key name and reason."""
    if rejected is not None:
        m.child(m.limit_rejections, name, rejected.reason).inc()
        raise Reject(
            429,
            rejected.message,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(rejected.retry_after_s)},
        )
