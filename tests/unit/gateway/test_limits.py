"""The per-key limiter on a fake clock: bursts, refill, concurrency, reloads that keep counts sane."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pdfleet.gateway.limits import (
    KeyLimits,
    Limiter,
    LimitsSpec,
    ModelLimits,
    check_limit_names,
    prompt_limit,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _limiter(clock: Clock, **default: object) -> Limiter:
    return Limiter(LimitsSpec(default=KeyLimits(**default)), clock)  # type: ignore[arg-type]


def _admitted(lim: Limiter, name: str, n: int) -> int:
    """How many of n back-to-back requests are admitted (each released at once: only the rate counts)."""
    ok = 0
    for _ in range(n):
        if lim.acquire(name) is None:
            ok += 1
            lim.release(name)
    return ok


def test_no_limits_admits_everything_and_still_counts_in_flight() -> None:
    lim = _limiter(Clock())
    for _ in range(1000):
        assert lim.acquire("user") is None
    assert lim.in_flight == {"user": 1000} and lim.buckets == {}
    for _ in range(1000):
        lim.release("user")
    assert lim.in_flight == {}


def test_a_burst_is_admitted_then_the_bucket_refills_at_the_rate() -> None:
    clock = Clock()
    lim = _limiter(clock, requests_per_second=2, burst=5)
    assert _admitted(lim, "user", 20) == 5  # the burst, then nothing without time passing
    rej = lim.acquire("user")
    assert rej is not None and rej.reason == "rate" and rej.retry_after_s == 1
    assert "2 requests per second" in rej.message and "'user'" in rej.message
    clock.t += 1.0
    assert _admitted(lim, "user", 20) == 2  # one second at 2/s
    clock.t += 100.0
    assert _admitted(lim, "user", 20) == 5  # refill is capped at the burst


def test_the_default_burst_is_one_seconds_worth_and_a_slow_rate_says_how_long_to_wait() -> None:
    clock = Clock()
    lim = _limiter(clock, requests_per_second=0.1)
    assert _admitted(lim, "user", 3) == 1
    rej = lim.acquire("user")
    assert rej is not None and rej.retry_after_s == 10  # 1 token at 0.1/s
    clock.t += 9.5
    rej = lim.acquire("user")
    assert rej is not None and rej.retry_after_s == 1  # ceil(0.5 s)
    clock.t += 0.5
    assert lim.acquire("user") is None


def test_keys_have_their_own_buckets_and_overrides_fall_back_to_the_default() -> None:
    clock = Clock()
    spec = LimitsSpec(
        default=KeyLimits(requests_per_second=1, concurrent_streams=3),
        keys={"batch": KeyLimits(requests_per_second=10, burst=10)},
    )
    lim = Limiter(spec, clock)
    assert _admitted(lim, "user", 5) == 1
    assert _admitted(lim, "batch", 50) == 10
    assert lim.limits("batch").concurrent_streams == 3  # unset in the override: the default's


def test_concurrency_counts_until_release() -> None:
    lim = _limiter(Clock(), concurrent_streams=2)
    assert lim.acquire("user") is None and lim.acquire("user") is None
    rej = lim.acquire("user")
    assert rej is not None and rej.reason == "concurrency" and rej.retry_after_s == 1
    assert "2 requests in flight" in rej.message
    assert lim.acquire("other") is None  # another key is not affected
    lim.release("user")
    assert lim.acquire("user") is None


def test_a_rejected_request_takes_no_slot_and_no_token() -> None:
    clock = Clock()
    lim = _limiter(clock, requests_per_second=1, burst=1, concurrent_streams=1)
    assert lim.acquire("user") is None
    assert lim.acquire("user") is not None  # concurrency: refused before the bucket is touched
    lim.release("user")
    clock.t += 1.0
    assert lim.acquire("user") is None  # the bucket had its token: the refusal took none
    assert lim.in_flight == {"user": 1}


def test_reload_keeps_in_flight_counts_and_bucket_levels() -> None:
    clock = Clock()
    lim = _limiter(clock, requests_per_second=1, burst=10, concurrent_streams=5)
    for _ in range(4):
        assert lim.acquire("user") is None
    # the same limits again, as a reload of an unchanged file: no new burst, same requests in flight
    lim.configure(LimitsSpec(default=KeyLimits(requests_per_second=1, burst=10, concurrent_streams=5)))
    assert lim.in_flight == {"user": 4}
    assert lim.buckets["user"].level == pytest.approx(6)
    assert lim.acquire("user") is None
    assert lim.acquire("user") is not None  # 5 in flight: the limit still holds across the reload
    # a lower concurrency limit counts the streams already in flight
    lim.configure(LimitsSpec(default=KeyLimits(requests_per_second=1, burst=10, concurrent_streams=2)))
    for _ in range(3):
        lim.release("user")
    assert lim.acquire("user") is not None  # 2 still in flight
    lim.release("user")
    assert lim.acquire("user") is None


def test_reload_caps_the_bucket_at_a_lower_burst_and_never_refills_it() -> None:
    clock = Clock()
    lim = _limiter(clock, requests_per_second=1, burst=10)
    assert _admitted(lim, "user", 10) == 10  # bucket empty
    lim.configure(LimitsSpec(default=KeyLimits(requests_per_second=5, burst=20)))
    assert lim.acquire("user") is not None  # a higher limit is not a fresh burst
    clock.t += 1.0
    assert _admitted(lim, "user", 50) == 5  # refills at the new rate
    clock.t += 100.0
    lim.configure(LimitsSpec(default=KeyLimits(requests_per_second=1, burst=3)))
    assert _admitted(lim, "user", 50) == 3  # capped at the new, lower burst


def test_reload_that_removes_a_rate_limit_drops_the_bucket() -> None:
    lim = _limiter(Clock(), requests_per_second=1)
    assert _admitted(lim, "user", 3) == 1
    lim.configure(LimitsSpec())
    assert lim.buckets == {} and _admitted(lim, "user", 3) == 3


def test_prompt_limit_is_the_tighter_of_key_and_alias() -> None:
    spec = LimitsSpec(
        default=KeyLimits(max_prompt_tokens=1000), models={"small": ModelLimits(max_prompt_tokens=200)}
    )
    assert prompt_limit(spec, spec.for_key("user"), "llama") == (1000, "key")
    assert prompt_limit(spec, spec.for_key("user"), "small") == (200, "model 'small'")
    assert prompt_limit(LimitsSpec(), KeyLimits(), "llama") is None


def test_limits_are_validated() -> None:
    for bad in ({"requests_per_second": 0}, {"burst": 0}, {"concurrent_streams": -1}, {"bogus": 1}):
        with pytest.raises(ValidationError):
            KeyLimits(**bad)  # type: ignore[arg-type]
    spec = LimitsSpec(keys={"nobody": KeyLimits()}, models={"gpt": ModelLimits()})
    problems = check_limit_names(spec, {"user", "admin"}, {"llama"}, "policy.yaml")
    assert problems == [
        "policy.yaml: limits.keys.nobody: no key of that name in the keys file (names: admin, user)",
        "policy.yaml: limits.models.gpt: not a model alias (aliases: llama)",
    ]
