"""The per-key limiter on a fake clock (bursts, refill, concurrency, reloads that keep counts sane), then
over HTTP through a real gateway: 429s with Retry-After in each route's shape, slots released however a
request ends, prompt-token 400s, limits reloaded with the policy."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from pdfleet.errors import ValidationError as PdfleetValidationError
from pdfleet.gateway.limits import Limiter, check_limit_names, limits_summary, prompt_limit, slot
from pdfleet.gateway.policy import policy_text
from pdfleet.model.limits import KeyLimits, LimitsSpec, ModelLimits, RateLimits
from tests.unit.gateway.helpers import ADMIN_KEY, LONG, USER_KEY, Env, auth, chat, error_of, policy_dict, run

MESSAGES = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


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
    rates = [0, float("inf"), float("nan"), 1e-300, 1e300, 0.0009]  # N5: .inf and 1e-300 passed
    for bad in (
        *({"requests_per_second": r} for r in rates),
        {"burst": 0},
        {"concurrent_streams": -1},
        {"bogus": 1},
    ):
        with pytest.raises(ValidationError):
            KeyLimits(**bad)  # type: ignore[arg-type]
    # the slowest rate allowed asks for a wait a header can say
    clock = Clock()
    lim = _limiter(clock, requests_per_second=0.001)
    assert lim.acquire("user") is None
    lim.release("user")
    rejected = lim.acquire("user")
    assert rejected is not None and rejected.retry_after_s == 1000
    spec = LimitsSpec(keys={"nobody": KeyLimits()}, models={"gpt": ModelLimits()})
    problems = check_limit_names(spec, {"user", "admin"}, {"llama"}, "policy.yaml")
    assert problems == [
        "policy.yaml: limits.keys.nobody: no key of that name in the keys file (names: admin, user)",
        "policy.yaml: limits.models.gpt: not a model alias (aliases: llama)",
    ]


# ---- over HTTP: a real gateway in front of fake upstreams ---------------------------------------


def _rejections(env: Env, reason: str) -> Any:
    return env.metric("pdfleet_gateway_limit_rejections_total", key="user", reason=reason)


def test_rate_limit_is_a_429_with_retry_after_in_each_routes_shape(tmp_path: Path) -> None:
    limits = {"keys": {"user": {"requests_per_second": 0.5, "burst": 2}}}

    async def scenario() -> None:
        async with Env(tmp_path, limits=limits) as env:
            # no refill between the requests, however slowly they run niced beside the lab: a second's
            # would make the Retry-After 1, two the next request a 200
            env.gw.gateway.limiter.clock = lambda: 0.0  # type: ignore[union-attr]
            for _ in range(2):
                st, _, _ = await env.post("/v1/chat/completions", chat())
                assert st == 200
            st, h, raw = await env.post("/v1/chat/completions", chat())
            assert st == 429 and h["Retry-After"] == "2"
            err = error_of(raw)
            assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
            assert "0.5 requests per second" in err["message"] and USER_KEY not in err["message"]
            st, h, raw = await env.post("/v1/messages", MESSAGES, headers={"x-api-key": USER_KEY})
            assert st == 429 and h["Retry-After"] == "2"
            assert json.loads(raw)["error"]["type"] == "rate_limit_error"
            assert json.loads(raw)["type"] == "error"
            st, _, _ = await env.post("/v1/chat/completions", chat(), headers=auth(ADMIN_KEY))
            assert st == 200  # the admin key has no limit
            assert await _rejections(env, "rate") == 2
            assert await env.metric("pdfleet_gateway_requests_total", status="429") == 2
            assert len(env.colo.seen) + len(env.dis.seen) == 3  # nothing refused reached a pool

    run(scenario())


def test_concurrency_is_released_when_streams_end_the_client_leaves_or_the_upstream_fails(
    tmp_path: Path,
) -> None:
    limits = {"default": {"concurrent_streams": 2}}

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.05, limits=limits) as env:
            limiter = env.gw.gateway.limiter  # type: ignore[union-attr]
            url = env.base + "/v1/chat/completions"
            a = await env.session.post(url, json=chat(stream=True, max_tokens=100), headers=auth())
            b = await env.session.post(url, json=chat(stream=True, max_tokens=100), headers=auth())
            assert a.status == b.status == 200 and limiter.in_flight == {"user": 2}
            st, h, raw = await env.post("/v1/chat/completions", chat())
            assert (
                st == 429 and h["Retry-After"] == "1" and "2 requests in flight" in error_of(raw)["message"]
            )
            await a.content.readline()
            a.close()  # the client goes away mid-stream
            await _until(lambda: limiter.in_flight.get("user") == 1)
            b.close()
            await _until(lambda: "user" not in limiter.in_flight)
            env.colo.mode = env.dis.mode = "500"  # the upstream fails: the slot comes back all the same
            for _ in range(3):
                st, _, _ = await env.post("/v1/chat/completions", chat())
                assert st == 500  # relayed from the last attempt
            env.colo.mode = env.dis.mode = "cut"  # and when it breaks mid-stream
            for _ in range(3):
                st, _, _ = await env.post("/v1/chat/completions", chat(stream=True, max_tokens=5))
                assert st == 200
            assert "user" not in limiter.in_flight
            assert await _rejections(env, "concurrency") == 1

    run(scenario())


def test_max_prompt_tokens_is_a_400_with_the_limit_and_the_estimate(tmp_path: Path) -> None:
    limits = {"keys": {"user": {"max_prompt_tokens": 1200}}, "models": {"llama": {"max_prompt_tokens": 2000}}}

    async def scenario() -> None:
        async with Env(tmp_path, limits=limits) as env:
            st, _, raw = await env.post("/v1/chat/completions", chat(LONG))
            err = error_of(raw)
            assert st == 400 and err["code"] == "prompt_too_long"
            assert "about 1504 tokens" in err["message"] and "limit for this key is 1200" in err["message"]
            st, _, raw = await env.post("/v1/chat/completions", chat(LONG), headers=auth(ADMIN_KEY))
            assert st == 200  # the admin key has only the alias's limit
            st, _, raw = await env.post("/v1/chat/completions", chat(LONG + LONG), headers=auth(ADMIN_KEY))
            assert st == 400 and "limit for this model 'llama' is 2000" in error_of(raw)["message"]
            assert await _rejections(env, "prompt_tokens") == 1
            assert env.gw.gateway.limiter.in_flight == {}  # type: ignore[union-attr]

    run(scenario())


def test_limits_reload_with_the_policy_and_keep_counts(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.05) as env:
            limiter = env.gw.gateway.limiter  # type: ignore[union-attr]
            # the bucket refills only by what the test does, not by the seconds a process starved beside
            # the lab loses between its requests (a second: Retry-After 4; five: a token back)
            limiter.clock = lambda: 0.0
            url = env.base + "/v1/chat/completions"
            held = await env.session.post(url, json=chat(stream=True, max_tokens=100), headers=auth())
            assert held.status == 200 and limiter.in_flight == {"user": 1}
            slow = {"default": {"concurrent_streams": 1, "requests_per_second": 0.2}}  # a token per 5 s
            env.rewrite_policy(version=2, limits=slow)
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            st, _, _ = await env.post("/v1/chat/completions", chat())
            assert st == 429  # the stream from before the reload still counts
            held.close()
            await _until(lambda: "user" not in limiter.in_flight)
            st, _, _ = await env.post("/v1/chat/completions", chat())
            assert st == 200  # takes the bucket's one token (the concurrency 429 took none)
            st, h, _ = await env.post("/v1/chat/completions", chat())
            assert st == 429 and h["Retry-After"] == "5"
            env.rewrite_policy(version=3, limits=slow)
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            st, _, _ = await env.post("/v1/chat/completions", chat())
            assert st == 429  # a reload is not a fresh burst
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                info = await r.json()
            assert info["limits"]["spec"]["default"] == {"requests_per_second": 0.2, "concurrent_streams": 1}
            env.rewrite_policy(version=4, limits={"keys": {"nobody": {"burst": 1}}})
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 422
                assert "limits.keys.nobody: no key of that name" in error_of(await r.read())["message"]

    run(scenario())


async def _until(pred: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


# ---- limits that name models -------------------------------------------------------------------------


def test_names_in_models_and_per_model_must_be_aliases() -> None:
    spec = LimitsSpec(
        default=KeyLimits(models=["llama", "gtp"]),
        keys={"user": KeyLimits(per_model={"claud": RateLimits(concurrent_streams=1)})},
    )
    problems = check_limit_names(spec, {"user"}, {"llama", "gpt"}, "p.yaml")
    assert problems == [
        "p.yaml: limits.default.models[1]: 'gtp' is not a model alias (aliases: gpt, llama)",
        "p.yaml: limits.keys.user.per_model.claud: not a model alias (aliases: gpt, llama)",
    ]


def test_a_keys_own_limits_on_one_alias_count_in_a_slot_of_their_own() -> None:
    clock = Clock()
    per = {"gpt": RateLimits(concurrent_streams=1, requests_per_second=1, burst=1)}
    lim = Limiter(LimitsSpec(keys={"user": KeyLimits(per_model=per)}), clock)
    assert lim.acquire_model("user", "llama") == (None, None)  # no limits of its own there
    assert lim.acquire_model("admin", "gpt") == (None, None)
    name, rejected = lim.acquire_model("user", "gpt")
    assert (name, rejected) == (slot("user", "gpt"), None) and lim.in_flight == {slot("user", "gpt"): 1}
    assert limits_summary(lim)["in_flight"] == {"user/gpt": 1}
    # a key whose name looks like a slot's display form counts apart from it
    assert lim.acquire("user/gpt") is None and lim.in_flight[slot("user", "gpt")] == 1
    lim.release("user/gpt")
    _, second = lim.acquire_model("user", "gpt")
    assert second is not None and second.reason == "concurrency"
    assert "key 'user' on model 'gpt' already has 1 requests in flight" in second.message
    lim.release(slot("user", "gpt"))
    _, third = lim.acquire_model("user", "gpt")
    assert third is not None and third.reason == "rate"  # the burst of 1 went to the first
    clock.t += 1.0
    assert lim.acquire_model("user", "gpt")[1] is None
    lim.release(slot("user", "gpt"))
    lim.configure(LimitsSpec())  # a reload without per_model limits drops the slot's bucket
    assert lim.buckets == {} and lim.acquire_model("user", "gpt") == (None, None)


def test_a_key_may_be_kept_to_some_models_and_limited_on_one(tmp_path: Path) -> None:
    def models(colo: str, dis: str) -> dict[str, Any]:
        return {"llama": {"colocated": [colo], "disagg": dis}, "small": {"colocated": [colo]}}

    limits = {
        "keys": {
            "user": {
                "models": ["llama"],
                "per_model": {"llama": {"concurrent_streams": 1, "max_prompt_tokens": 1200}},
            }
        }
    }

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.05, models=models, limits=limits) as env:
            limiter = env.gw.gateway.limiter  # type: ignore[union-attr]
            st, _, raw = await env.post("/v1/chat/completions", {**chat(), "model": "small"})
            err = error_of(raw)
            assert (st, err["code"]) == (403, "model_not_allowed")
            assert err["message"] == "the key 'user' may not use model 'small'; its models: llama"
            st, _, _ = await env.post("/v1/chat/completions", {**chat(), "model": "small"}, auth(ADMIN_KEY))
            assert st == 200  # the admin key has no such restriction
            async with env.session.get(env.base + "/v1/models", headers=auth()) as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["llama"]
            async with env.session.get(env.base + "/v1/models", headers=auth(ADMIN_KEY)) as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["llama", "small"]
            url = env.base + "/v1/chat/completions"
            held = await env.session.post(url, json=chat(stream=True, max_tokens=100), headers=auth())
            assert held.status == 200 and limiter.in_flight == {"user": 1, slot("user", "llama"): 1}
            st, h, raw = await env.post("/v1/chat/completions", chat())
            assert st == 429 and "key 'user' on model 'llama'" in error_of(raw)["message"]
            assert limiter.in_flight == {"user": 1, slot("user", "llama"): 1}  # the refused one holds nothing
            held.close()
            await _until(lambda: limiter.in_flight == {})
            st, _, raw = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 400 and "limit for this key on model 'llama' is 1200" in error_of(raw)["message"]
            assert await _rejections(env, "model") == 1 and await _rejections(env, "concurrency") == 1
            assert limiter.in_flight == {}

    run(scenario())


def test_a_policy_naming_an_unknown_alias_in_its_limits_is_refused_before_it_is_written(
    tmp_path: Path,
) -> None:
    doc = policy_dict(["http://127.0.0.1:9"], None, limits={"keys": {"user": {"models": ["lama"]}}})
    path = tmp_path / "policy.yaml"
    with pytest.raises(PdfleetValidationError) as exc:
        policy_text(doc, path)  # what provision renders through: no keys file is read yet
    assert "limits.keys.user.models[0]: 'lama' is not a model alias (aliases: llama)" in str(exc.value)
    assert not path.exists()
