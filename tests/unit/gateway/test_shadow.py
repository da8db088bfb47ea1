"""Shadow traffic: the pure choice (each drop reason, in order), which requests a run selects, the admin
endpoint's checks, and end to end on loopback: the copy reaches the P/D pool and is thrown away, both
sides land in the shadow series, the client is never failed, limited or slowed by it, and shadows are
dropped with a reason when their slots are full, the P/D pool keeps failing, or a reload comes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pdfleet.gateway.decider import Load
from pdfleet.gateway.policy_spec import ShadowSpec
from pdfleet.gateway.shadow import ShadowRun, choose
from pdfleet.model.stages import StageSpec
from tests.unit.gateway.helpers import ADMIN_KEY, LONG, USER_KEY, Env, auth, chat, run, sse_events

FRESH = Load(0, 0.1)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({}, None),
        ({"in_flight": 8}, "concurrency"),
        ({"in_flight": 8, "unhealthy": True}, "concurrency"),  # slots first
        ({"unhealthy": True, "loads": [Load(9, 0.1)]}, "shadow_unhealthy"),
        ({"loads": [FRESH, Load(5, 0.1)]}, "shadow_queue"),  # past the bound of 4
        ({"loads": [Load(None, None)]}, "shadow_queue"),  # unknown is never idle
        ({"loads": [Load(1, 10.0)]}, "shadow_queue"),  # stale
        ({"primary_in_flight": 11}, "primary_pressure"),
        ({"primary_in_flight": 10}, None),
    ],
)
def test_choose_drops_in_order(kwargs: dict[str, Any], reason: str | None) -> None:
    spec = ShadowSpec(primary_in_flight_max=10)
    args: dict[str, Any] = {
        "in_flight": 0,
        "loads": [FRESH],
        "stale_s": 3.0,
        "primary_in_flight": 0,
        "unhealthy": False,
    }
    assert choose(spec, **{**args, **kwargs}) == reason


def test_no_queue_bound_never_drops_for_the_queue() -> None:
    spec = ShadowSpec(pd_waiting_max=None)
    assert choose(spec, 0, [Load(None, None)], 3.0, 0, False) is None


def test_a_run_selects_its_stage_classes_and_the_top_buckets() -> None:
    r = ShadowRun("long-prompts", StageSpec(short=0, long=100), 20, time.monotonic() + 60)
    assert r.selects("m", "long", 80) and r.selects("m", "long", 99)
    assert not r.selects("m", "long", 79) and not r.selects("m", "short", 99)
    one = ShadowRun("half", StageSpec(short=50, long=50), 100, time.monotonic() + 60, model="a")
    assert one.selects("a", "short", 0) and not one.selects("b", "short", 0)
    narrowed = ShadowRun("half", StageSpec(short=50, long=50), 100, time.monotonic() + 60, classes=("long",))
    assert narrowed.selects("a", "long", 0) and not narrowed.selects("a", "short", 99)


async def _shadow(env: Env, body: dict[str, Any], key: str = ADMIN_KEY) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    async with env.session.post(env.base + "/admin/shadow", data=data, headers=auth(key)) as r:
        return r.status, json.loads(await r.read())


START = {"action": "start", "stage": "long-all", "share": 100, "minutes": 5}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"action": "start", "stage": "nope", "share": 20, "minutes": 1}, "stage: 'nope' is not a stage"),
        ({"action": "start", "stage": "off", "share": 20, "minutes": 1}, "moves no class to P/D"),
        ({"action": "start", "stage": "long-all", "share": 0, "minutes": 1}, "share"),
        ({"action": "start", "stage": "long-all", "share": 20}, "start needs stage, share"),
        ({"action": "start", "stage": "long-all", "share": 20, "minutes": 1e6}, "shadow.max_minutes"),
        ({**START, "model": "other"}, "model: 'other' routes nothing here (models: llama)"),
        ({**START, "classes": ["short"]}, "classes: stage 'long-all' moves 0% of short"),
        ({**START, "classes": ["medium"]}, "classes"),
        ({**START, "tag": "no spaces allowed"}, "tag"),
        ({"action": "go"}, "action"),
        ([1], "must be a JSON object"),
    ],
)
def test_admin_shadow_refuses_bad_requests_and_starts_nothing(
    tmp_path: Path, body: Any, message: str
) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, stage="off") as env:
            st, doc = await _shadow(env, body)
            assert st == 400 and message in doc["error"]["message"], doc
            async with env.session.get(env.base + "/admin/shadow", headers=auth(ADMIN_KEY)) as r:
                assert (await r.json())["running"] is None
            st, _ = await _shadow(env, START, key=USER_KEY)
            assert st == 403  # a user key cannot start one

    run(scenario())


def test_a_shadowed_request_reaches_the_pd_pool_and_both_sides_are_measured(tmp_path: Path) -> None:
    limits = {"keys": {"user": {"concurrent_streams": 1}}}

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.01, stage="off", limits=limits) as env:
            env.dis.delay = 0.2  # slow shadows, their chunk gaps measured
            # held until released: out while the client has its answer and sends the next request, however
            # slowly this process runs niced beside the lab
            env.dis.hold = asyncio.Event()
            st, doc = await _shadow(env, START)
            assert st == 200 and doc["running"]["stage"] == "long-all"
            assert await env.metric("pdfleet_gateway_shadow_share_percent") == 100
            st, h, raw = await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=3))
            # the client did not wait for its shadow: that is still out once the client has its whole answer
            assert await env.metric("pdfleet_gateway_shadow_in_flight") == 1
            assert st == 200 and h["X-Pdfleet-Pool"] == "colocated"
            assert all("colo" in e for e in sse_events(raw) if e != "[DONE]")  # nothing of the shadow
            # the shadow holds no slot of the key (1 stream): the next request is served, not a 429
            st, _, _ = await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=3))
            assert st == 200
            st, _, _ = await env.post("/v1/chat/completions", chat("short", stream=True, max_tokens=3))
            assert st == 200  # a short prompt: the stage's class is long only
            env.dis.hold.set()
            for _ in range(600):  # up to 30 s: niced beside the lab, this process can be starved for seconds
                if await env.metric("pdfleet_gateway_shadow_in_flight") == 0:
                    break
                await asyncio.sleep(0.05)
            assert len(env.dis.seen) == 2 and env.dis.seen[0]["headers"]["X-Request-Id"].endswith("-shadow")
            side = {"length_class": "long", "length_bin": "0-2k"}
            shadow = {**side, "pool": "disagg", "shadow": "true"}
            primary = {**side, "pool": "colocated", "shadow": "false"}
            assert await env.metric("pdfleet_gateway_shadow_requests_total", outcome="ok", **shadow) == 2
            assert await env.metric("pdfleet_gateway_shadow_requests_total", outcome="ok", **primary) == 2
            assert await env.metric("pdfleet_gateway_shadow_ttft_seconds_count", **shadow) == 2
            assert await env.metric("pdfleet_gateway_shadow_ttft_seconds_count", **primary) == 2
            assert await env.metric("pdfleet_gateway_shadow_chunk_gap_seconds_count", **shadow) >= 2
            # the primary's own series hold no shadow
            assert await env.metric("pdfleet_gateway_requests_total", pool="disagg") == 0
            st, doc = await _shadow(env, {"action": "stop"})
            assert doc["running"] is None and doc["last"]["sent"] == 2 and doc["last"]["ok"] == 2
            assert await env.metric("pdfleet_gateway_shadow_share_percent") == 0
            await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=3))
            assert len(env.dis.seen) == 2  # stopped: no more shadows

    run(scenario())


def test_full_slots_and_a_failing_pd_pool_drop_shadows_and_fail_no_client(tmp_path: Path) -> None:
    shadow = {"max_in_flight": 1, "unhealthy_after": 2, "unhealthy_s": 60}

    async def scenario() -> None:
        async with Env(tmp_path, stage="off", shadow=shadow) as env:
            # the first shadow is held until released, not out for a fixed time that a process starved
            # beside the lab could outlast before the next two requests come
            env.dis.hold = asyncio.Event()
            await _shadow(env, START)
            for _ in range(3):  # the first shadow holds the one slot
                st, _, _ = await env.post("/v1/chat/completions", chat(LONG, max_tokens=2))
                assert st == 200
            assert await env.metric("pdfleet_gateway_shadow_dropped_total", reason="concurrency") == 2
            env.dis.hold.set()
            for _ in range(600):  # up to 30 s
                if await env.metric("pdfleet_gateway_shadow_in_flight") == 0:
                    break
                await asyncio.sleep(0.05)
            await env.dis.stop()  # the P/D pool goes away mid-shadow
            for _ in range(6):
                st, _, _ = await env.post("/v1/chat/completions", chat(LONG, max_tokens=2))
                assert st == 200
                await asyncio.sleep(0.05)
            assert (
                await env.metric("pdfleet_gateway_shadow_requests_total", shadow="true", outcome="error") == 2
            )
            assert await env.metric("pdfleet_gateway_shadow_dropped_total", reason="shadow_unhealthy") == 4
            assert await env.metric("pdfleet_gateway_requests_total", pool="colocated", status="200") == 9

    run(scenario())


def test_a_stop_with_a_tag_ends_only_the_run_carrying_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, stage="off") as env:
            st, doc = await _shadow(env, {**START, "classes": ["long"], "tag": "pdfleet-rollout/-/a:1"})
            assert st == 200 and (doc["running"]["classes"], doc["running"]["tag"]) == (
                ["long"],
                "pdfleet-rollout/-/a:1",
            )
            st, doc = await _shadow(env, {"action": "stop", "tag": "pdfleet-rollout/-/b:2"})
            assert st == 200 and doc["running"]["tag"] == "pdfleet-rollout/-/a:1"  # not that one: runs on
            st, doc = await _shadow(env, {"action": "stop", "tag": "pdfleet-rollout/-/a:1"})
            assert st == 200 and doc["running"] is None and doc["last"]["tag"] == "pdfleet-rollout/-/a:1"
            await _shadow(env, START)  # an untagged run (the operator's) ...
            st, doc = await _shadow(env, {"action": "stop", "tag": "pdfleet-rollout/-/a:1"})
            assert doc["running"] is not None  # ... is not the controller's to stop
            st, doc = await _shadow(env, {"action": "stop"})
            assert doc["running"] is None

    run(scenario())


def test_a_reload_cuts_the_shadows_in_flight_and_the_run_goes_on(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, stage="off") as env:
            env.dis.mode = "hang"
            await _shadow(env, START)
            st, _, _ = await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=2))
            assert st == 200 and await env.metric("pdfleet_gateway_shadow_in_flight") == 1
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            await asyncio.sleep(0.1)
            assert await env.metric("pdfleet_gateway_shadow_dropped_total", reason="reload") == 1
            assert await env.metric("pdfleet_gateway_shadow_in_flight") == 0
            async with env.session.get(env.base + "/admin/shadow", headers=auth(ADMIN_KEY)) as r:
                doc = await r.json()
            assert doc["running"]["dropped"] == {"reload": 1}

    run(scenario())


def test_stalls_beside_a_long_prefill_on_the_same_instance_are_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.06, stage="off", stall_threshold_ms=40) as env:
            alone = chat("short", stream=True, max_tokens=4)
            assert (await env.post("/v1/chat/completions", alone))[0] == 200
            assert await env.metric("pdfleet_gateway_long_prefill_stalls_total") == 0
            assert await env.metric("pdfleet_gateway_long_prefill_overlaps_total") == 0
            env.colo.delay = 0.12  # each chunk, the first too (the long prompt's prefill), 120 ms

            async def long_later() -> None:
                await asyncio.sleep(0.2)
                await env.post("/v1/chat/completions", chat(LONG, stream=True, max_tokens=2))

            short = env.post("/v1/chat/completions", chat("short", stream=True, max_tokens=8))
            (st, _, _), _ = await asyncio.gather(short, long_later())
            assert st == 200
            assert await env.metric("pdfleet_gateway_long_prefill_overlaps_total", length_class="short") == 1
            assert await env.metric("pdfleet_gateway_long_prefill_stalls_total", length_class="short") >= 1

    run(scenario())
