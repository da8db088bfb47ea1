"""The pure per-request decision: one test per reason, stale facts as unknown, the instance choice, and
the stage's stickiness (a conversation stays put; a ramp only moves buckets towards the P/D pool)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from pdfleet.gateway.decider import (
    REASONS,
    Facts,
    Load,
    choose_instance,
    decide,
    reason_mix_text,
    reason_shares,
)
from pdfleet.gateway.policy import bucket_of
from pdfleet.model.routing import DeciderSpec
from pdfleet.model.stages import StageSpec

THRESHOLD = 8192
LONG = 30_000
ALL_PD = StageSpec(short=0, long=100)
EFFECTIVE = DeciderSpec(threshold_on="effective", colocated_choice="prefix_load")
BOUNDED = DeciderSpec(prefill_busy_waiting=4, decode_busy_waiting=8)
FRESH = Load(0, 0.2)


def facts(**over: Any) -> Facts:
    """A long prompt in bucket 10, two idle colocated instances with nothing cached, a P/D pool."""
    base: dict[str, Any] = {
        "tokens": LONG,
        "bucket": 10,
        "cached": [0, 0],
        "outstanding": [0, 0],
        "rr": 0,
        "has_pd_pool": True,
        "endpoint_carried": True,
    }
    return Facts(**(base | over))


def test_forced_header_wins_over_everything() -> None:
    v = decide(
        BOUNDED, StageSpec(short=0, long=0), THRESHOLD, facts(forced="disagg", prefill=[Load(None, None)])
    )
    assert (v.pool, v.reason) == ("disagg", "forced_header")
    v = decide(BOUNDED, ALL_PD, THRESHOLD, facts(forced="colocated"))
    assert (v.pool, v.reason) == ("colocated", "forced_header")


def test_stage_weight_sends_a_long_prompt_in_the_share_to_pd() -> None:
    v = decide(DeciderSpec(), ALL_PD, THRESHOLD, facts())
    assert (v.pool, v.reason, v.cls, v.effective) == ("disagg", "stage_weight", "long", LONG)


def test_stage_weight_keeps_a_bucket_outside_every_share_colocated() -> None:
    v = decide(DeciderSpec(), StageSpec(short=0, long=5), THRESHOLD, facts(bucket=50))
    assert (v.pool, v.reason) == ("colocated", "stage_weight")


def test_short_prompt_stays_colocated_as_short() -> None:
    v = decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(tokens=500))
    assert (v.pool, v.reason, v.cls) == ("colocated", "short", "short")


def test_cached_prefix_makes_a_long_prompt_short() -> None:
    """An agent's tenth turn: 30K tokens, all but 200 cached on instance 1."""
    f = facts(cached=[0, LONG - 200])
    v = decide(EFFECTIVE, ALL_PD, THRESHOLD, f)
    assert (v.pool, v.instance, v.reason, v.cls, v.effective) == (
        "colocated",
        1,
        "cached_prefix",
        "short",
        200,
    )
    by_length = decide(
        DeciderSpec(threshold_on="prompt", colocated_choice="prefix_load"), ALL_PD, THRESHOLD, f
    )
    assert (by_length.pool, by_length.reason) == ("disagg", "stage_weight")


def test_prefill_busy_past_the_bound() -> None:
    v = decide(BOUNDED, ALL_PD, THRESHOLD, facts(prefill=[FRESH, Load(5, 0.1)], decode=[FRESH]))
    assert (v.pool, v.reason) == ("colocated", "prefill_busy")
    v = decide(BOUNDED, ALL_PD, THRESHOLD, facts(prefill=[Load(4, 0.1)], decode=[FRESH]))
    assert (v.pool, v.reason) == ("disagg", "stage_weight")  # at the bound is not past it


def test_decode_busy_past_the_bound() -> None:
    v = decide(BOUNDED, ALL_PD, THRESHOLD, facts(prefill=[FRESH], decode=[Load(9, 0.5)]))
    assert (v.pool, v.reason) == ("colocated", "decode_busy")


def test_stale_or_missing_facts_are_unknown_never_idle() -> None:
    for unknown in (Load(0, 2.5), Load(None, None), Load(None, 0.1)):  # stale_s defaults to 2
        v = decide(BOUNDED, ALL_PD, THRESHOLD, facts(prefill=[unknown], decode=[FRESH]))
        assert (v.pool, v.reason) == ("colocated", "prefill_busy"), unknown
        v = decide(BOUNDED, ALL_PD, THRESHOLD, facts(prefill=[FRESH], decode=[unknown]))
        assert (v.pool, v.reason) == ("colocated", "decode_busy"), unknown
    # no bound: the figures are not read at all
    v = decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(prefill=[Load(None, None)]))
    assert v.pool == "disagg"


def test_endpoint_not_carried() -> None:
    v = decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(endpoint_carried=False))
    assert (v.pool, v.reason) == ("colocated", "endpoint_not_carried")


def test_no_pd_pool() -> None:
    v = decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(has_pd_pool=False, endpoint_carried=False))
    assert (v.pool, v.reason) == ("colocated", "no_pd_pool")


def test_fallback_is_in_the_closed_set_and_never_decided_here() -> None:
    """The proxy gives `fallback` to a request the P/D pool failed before its first byte (test_proxy,
    test_intake); the decision itself never returns it."""
    assert set(REASONS) == {
        "forced_header",
        "stage_weight",
        "short",
        "cached_prefix",
        "prefill_busy",
        "decode_busy",
        "endpoint_not_carried",
        "no_pd_pool",
        "fallback",
    }
    seen = set()
    for spec in (DeciderSpec(), EFFECTIVE, BOUNDED):
        for bucket in range(0, 100, 7):
            for tokens in (10, LONG):
                seen.add(
                    decide(
                        spec, StageSpec(short=20, long=60), THRESHOLD, facts(bucket=bucket, tokens=tokens)
                    ).reason
                )
    assert "fallback" not in seen


def test_round_robin_ignores_cache_and_load() -> None:
    spec = DeciderSpec(colocated_choice="round_robin")
    assert [choose_instance(spec, facts(rr=i, cached=[LONG, 0], outstanding=[0, 9])) for i in range(4)] == [
        0,
        1,
        0,
        1,
    ]


def test_prefix_load_prefers_the_cache_then_the_least_loaded() -> None:
    assert choose_instance(EFFECTIVE, facts(rr=0, cached=[0, 20_000])) == 1
    # two long prefills do not stack: the second goes to the instance with nothing outstanding
    assert choose_instance(EFFECTIVE, facts(rr=0, outstanding=[LONG, 0])) == 1
    # a cache hit is not worth queuing behind a longer backlog
    assert choose_instance(EFFECTIVE, facts(rr=0, cached=[20_000, 0], outstanding=[40_000, 0])) == 1
    # an idle pool with nothing cached still spreads, in round-robin order
    assert [choose_instance(EFFECTIVE, facts(rr=i)) for i in range(3)] == [0, 1, 0]


def test_prefix_load_keeps_a_fresh_prefill_off_the_instances_serving_requests() -> None:
    # issue 32's lab stall: a new session's 8,067-token first turn (uncached on both) while instance 0
    # serves a short turn (613 tokens still to prefill, or decoding already): it goes to instance 1, where
    # no request would decode beside its prefill (8,067 against 613 + 8,067 x 2)
    assert choose_instance(EFFECTIVE, facts(rr=0, tokens=8067, outstanding=[613, 0], serving=[1, 0])) == 1
    assert choose_instance(EFFECTIVE, facts(rr=0, tokens=8067, serving=[1, 0])) == 1
    # each request served waits for the uncached tokens: a backlog longer than that is still worse
    assert choose_instance(EFFECTIVE, facts(rr=0, tokens=8067, outstanding=[0, 9000], serving=[1, 1])) == 0
    # more requests served cost more: with some on both, the fewer
    assert choose_instance(EFFECTIVE, facts(rr=0, tokens=4000, serving=[3, 2])) == 1
    # a conversation's next turn stays where its prefix is cached, requests there or not: 800 new tokens
    # beside two cost 2,400 against 20,800 uncached elsewhere
    turn = facts(rr=0, tokens=20_800, cached=[20_000, 0], serving=[2, 0])
    assert choose_instance(EFFECTIVE, turn) == 0
    # a fully cached prompt stalls nobody: the requests served do not move it
    assert choose_instance(EFFECTIVE, facts(rr=1, tokens=4000, cached=[4000, 0], serving=[5, 0])) == 0
    # none counted (empty): the cost without them, as before
    assert choose_instance(EFFECTIVE, facts(rr=0, tokens=8067, outstanding=[0, 3000])) == 0
    # round robin ignores them
    rr = DeciderSpec(colocated_choice="round_robin")
    assert choose_instance(rr, facts(rr=0, serving=[9, 0])) == 0


def test_the_requests_own_choice_wins_over_the_policys() -> None:
    rr = DeciderSpec(colocated_choice="round_robin")
    assert choose_instance(rr, facts(rr=0, outstanding=[LONG, 0], choice="prefix_load")) == 1
    assert choose_instance(EFFECTIVE, facts(rr=0, outstanding=[LONG, 0], choice="round_robin")) == 0
    assert choose_instance(rr, facts(rr=0, outstanding=[LONG, 0], choice=None)) == 0
    verdict = decide(rr, ALL_PD, THRESHOLD, facts(rr=0, outstanding=[LONG, 0], choice="prefix_load"))
    assert verdict.instance == 1


def test_long_100_short_0_routes_by_class_only() -> None:
    for i in range(2000):
        bucket = bucket_of(f"s:{uuid.UUID(int=i)}")
        assert decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(bucket=bucket)).pool == "disagg"
        assert decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(bucket=bucket, tokens=100)).pool == "colocated"


def test_half_split_is_50_pm_5_and_sessions_stay_put() -> None:
    stage = StageSpec(short=50, long=50)
    buckets = [bucket_of(f"s:session-{i}") for i in range(4000)]
    first = [decide(DeciderSpec(), stage, THRESHOLD, facts(bucket=b)).pool for b in buckets]
    assert 0.45 <= sum(p == "disagg" for p in first) / len(first) <= 0.55
    again = [decide(DeciderSpec(), stage, THRESHOLD, facts(bucket=b)).pool for b in buckets]
    assert again == first  # every later turn of a conversation lands where its first one did


def test_ramp_only_moves_buckets_towards_disagg() -> None:
    buckets = [bucket_of(f"u:user{i}") for i in range(500)]
    for lo, hi in [(0, 5), (5, 25), (25, 50), (50, 100)]:
        for b in buckets:
            if (
                decide(DeciderSpec(), StageSpec(short=0, long=lo), THRESHOLD, facts(bucket=b)).pool
                == "disagg"
            ):
                assert (
                    decide(DeciderSpec(), StageSpec(short=0, long=hi), THRESHOLD, facts(bucket=b)).pool
                    == "disagg"
                )


def test_reason_shares_in_the_documented_order_and_none_without_requests() -> None:
    counts = {"short": 30.0, "stage_weight": 60.0, "cached_prefix": 9.6, "prefill_busy": 0.4, "fallback": 0.0}
    shares = reason_shares({**counts, "later_reason": 0.0})
    assert [r for r, _ in shares] == ["stage_weight", "short", "cached_prefix", "prefill_busy"]
    assert sum(x for _, x in shares) == pytest.approx(1.0)
    assert dict(shares)["stage_weight"] == pytest.approx(0.6)
    assert [r for r, _ in reason_shares({"zz_new": 1, "forced_header": 1})] == ["forced_header", "zz_new"]
    assert reason_shares({}) == [] and reason_shares({"short": 0.0}) == []
    text = reason_mix_text(counts)
    assert text == "stage_weight 60%, short 30%, cached_prefix 10%, prefill_busy 0.4% of 100 requests"
    assert reason_mix_text({"short": 0}) == "no request decided"


def test_a_request_may_ask_for_its_class_on_effective_or_on_prompt_tokens() -> None:
    """The threshold header's value overrides the policy's threshold_on for that request alone."""
    held: dict[str, Any] = {"cached": [LONG - 500, 0], "choice": "prefix_load"}
    asked = decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(**held, threshold_on="effective"))
    assert (asked.pool, asked.reason, asked.effective) == ("colocated", "cached_prefix", 500)
    assert decide(DeciderSpec(), ALL_PD, THRESHOLD, facts(**held)).reason == "stage_weight"
    whole = decide(EFFECTIVE, ALL_PD, THRESHOLD, facts(**held, threshold_on="prompt"))
    assert (whole.pool, whole.reason, whole.effective) == ("disagg", "stage_weight", LONG)
