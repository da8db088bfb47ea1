"""The decider through a running gateway on loopback: the reason in the response header and the decisions
metric (fallback included), a growing conversation kept on the instance holding its prefix, and the
prefill-busy bypass from scraped queues (a stopped instance is unknown, never idle)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from pdfleet.errors import ValidationError
from tests.unit.gateway.helpers import LONG, Env, FakeUpstream, auth, chat, error_of, load_test_policy, run

TURN = "turn " * 480  # 2400 characters: 600 tokens at 4 characters a token (the threshold is 1000)


class FakeMetrics:
    """A vLLM /metrics endpoint whose `vllm:num_requests_waiting` the test sets."""

    def __init__(self) -> None:
        self.waiting = 0
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _metrics(self, _request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {self.waiting}.0\n'
            f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="capacity"}} 99.0\n'
        )
        return web.Response(text=text)


def test_reason_in_header_and_metric_and_fallback(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 200 and (h["X-Pdfleet-Pool"], h["X-Pdfleet-Decision"]) == ("disagg", "stage_weight")
            st, h, _ = await env.post("/v1/chat/completions", chat("hi"))
            assert (h["X-Pdfleet-Pool"], h["X-Pdfleet-Decision"]) == ("colocated", "short")
            st, h, _ = await env.post("/v1/chat/completions", chat("hi"), {"X-Pdfleet-Pool": "disagg"})
            assert (h["X-Pdfleet-Pool"], h["X-Pdfleet-Decision"]) == ("disagg", "forced_header")
            await env.dis.stop()
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 200 and (h["X-Pdfleet-Pool"], h["X-Pdfleet-Decision"]) == ("colocated", "fallback")
            reasons = {
                r: await env.metric("pdfleet_gateway_decisions_total", model="llama", reason=r)
                for r in ("stage_weight", "short", "forced_header", "fallback")
            }
            assert reasons == {"stage_weight": 1, "short": 1, "forced_header": 1, "fallback": 1}

    run(scenario())


def _conversation(turns: int) -> dict[str, Any]:
    """One agent session's request after `turns` turns: each turn adds 600 tokens of context."""
    msgs = []
    for i in range(turns):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {TURN}"})
    return {"model": "llama", "messages": msgs}


def _served(raw: bytes) -> str:
    return str(json.loads(raw)["served_by"])


ASK_DECIDER = {"X-Pdfleet-Threshold-On": "Effective", "X-Pdfleet-Colocated-Choice": "prefix_load"}


@pytest.mark.parametrize("decider", ["decider", "length_only", "asked"])
def test_a_growing_conversation_keeps_its_instance_and_stays_colocated(tmp_path: Path, decider: str) -> None:
    """Turn 1 is short and goes colocated; later turns pass the threshold by length but only 600 tokens of
    each are new: the decider keeps them on the instance that holds the rest (`cached_prefix`); routing by
    length sends them to the P/D pool. `asked`: a length-only policy, the requests asking for the decider's
    settings in the threshold and choice headers (the lab's comparison on one gateway) get the decider."""

    async def scenario() -> None:
        third = FakeUpstream("third")
        await third.start()
        settings = (
            {"threshold_on": "effective", "colocated_choice": "prefix_load"}
            if decider == "decider"
            else {"threshold_on": "prompt", "colocated_choice": "round_robin"}
        )
        ask = ASK_DECIDER if decider == "asked" else {}

        def models(colo: str, dis: str) -> dict[str, Any]:
            return {"llama": {"colocated": [colo, dis], "disagg": third.url}}

        try:
            async with Env(tmp_path, models=models, decider=settings) as env:
                seen = []
                for turns in range(1, 5):
                    st, h, raw = await env.post("/v1/chat/completions", _conversation(turns), ask)
                    assert st == 200
                    seen.append((h["X-Pdfleet-Decision"], _served(raw)))
                if decider != "length_only":
                    first = seen[0][1]
                    assert seen == [("short", first)] + [("cached_prefix", first)] * 3
                    # another long prompt with nothing cached still goes to the P/D pool
                    st, h, _ = await env.post("/v1/chat/completions", chat(LONG), ask)
                    assert h["X-Pdfleet-Decision"] == "stage_weight" and h["X-Pdfleet-Pool"] == "disagg"
                else:
                    assert seen[0][0] == "short"
                    assert seen[1:] == [("stage_weight", "third")] * 3
                if decider == "asked":  # the policy's own routing for the requests that do not ask
                    st, h, _ = await env.post("/v1/chat/completions", _conversation(4))
                    assert h["X-Pdfleet-Decision"] == "stage_weight" and h["X-Pdfleet-Pool"] == "disagg"
                    assert env.gw is not None and env.gw.gateway.deciding.index is None
                    st, _, raw = await env.post(
                        "/v1/chat/completions", chat(), {"X-Pdfleet-Threshold-On": "all"}
                    )
                    err = error_of(raw)
                    assert st == 400 and err["param"] == "X-Pdfleet-Threshold-On"
                    assert "prompt, effective" in err["message"]
        finally:
            await third.stop()

    run(scenario())


def test_the_estimate_is_counted_for_where_each_request_went(tmp_path: Path) -> None:
    """A long prompt sent twice to the P/D pool: the first is estimated uncached, the second cached on the
    P/D router's address but for its last partial block; a short one on the colocated instance; a policy
    whose decider keeps no index estimates nothing (no series)."""

    async def scenario() -> None:
        async with Env(tmp_path, decider={"threshold_on": "effective"}) as env:
            for _ in range(2):
                st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
                assert st == 200 and h["X-Pdfleet-Pool"] == "disagg"
            st, h, _ = await env.post("/v1/chat/completions", chat("hi"))
            assert h["X-Pdfleet-Pool"] == "colocated"
            est = "pdfleet_gateway_prefix_estimate_cached_tokens_total"
            prompt = "pdfleet_gateway_prefix_estimate_prompt_tokens_total"
            dis, colo = env.dis.url.removeprefix("http://"), env.colo.url.removeprefix("http://")
            tokens = await env.metric(prompt, pool="disagg", upstream=dis)
            assert tokens > 2 * 1500  # two prompts of 6000 characters and a chat's role markers
            # the text of one prompt is 6006 characters: 93 whole blocks of 64 (16 tokens each)
            assert await env.metric(est, model="llama", pool="disagg", upstream=dis) == 93 * 16
            assert await env.metric(prompt, pool="colocated", upstream=colo) > 0
            assert await env.metric(est, pool="colocated", upstream=colo) == 0
        async with Env(tmp_path) as env:
            st, _, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 200
            text = await (await env.session.get(env.base + "/metrics")).text()
            assert "pdfleet_gateway_prefix_estimate_prompt_tokens_total{" not in text

    run(scenario())


def test_the_choice_header_picks_the_colocated_choice_for_that_request_only(tmp_path: Path) -> None:
    """A policy on round robin: a conversation that asks for prefix_load keeps its instance, one that
    does not alternates; a bad value is a 400 naming the header; a policy without overrides ignores it."""

    async def scenario() -> None:
        def models(colo: str, dis: str) -> dict[str, Any]:
            return {"llama": {"colocated": [colo, dis], "disagg": None}}

        async def turns(env: Env, headers: dict[str, str]) -> list[str]:
            seen = []
            for n in range(1, 5):
                st, h, raw = await env.post("/v1/chat/completions", _conversation(n), headers)
                assert st == 200, raw
                seen.append(_served(raw))
                assert h["X-Pdfleet-Instance"] == ("0" if seen[-1] == "colo" else "1")
            return seen

        ask = {"X-Pdfleet-Colocated-Choice": " Prefix_Load "}
        async with Env(tmp_path, models=models) as env:
            assert len(set(await turns(env, ask))) == 1  # the index the asking requests keep holds it
            assert len(set(await turns(env, {}))) == 2  # the policy's round robin, unchanged
            assert env.gw is not None and env.gw.gateway.deciding.index is None  # the policy keeps none
            st, _, raw = await env.post("/v1/chat/completions", chat(), {"X-Pdfleet-Colocated-Choice": "lru"})
            err = error_of(raw)
            assert st == 400 and err["param"] == "X-Pdfleet-Colocated-Choice"
            assert "round_robin, prefix_load" in err["message"]
        async with Env(tmp_path, models=models, override_header=None) as env:
            assert len(set(await turns(env, ask))) == 2  # overrides off: the header is not honoured

    run(scenario())


def test_a_fresh_prompt_goes_where_no_stream_is_decoding(tmp_path: Path) -> None:
    """prefix_load counts the streams the gateway is relaying from each colocated instance: with a stream
    decoding on instance 0, a fresh prompt whose round-robin turn is instance 0 goes to instance 1 (no
    prefill outstanding on either); once the stream ended, the round robin's order again."""

    async def scenario() -> None:
        def models(colo: str, dis: str) -> dict[str, Any]:
            return {"llama": {"colocated": [colo, dis], "disagg": None}}

        async with Env(tmp_path, models=models, decider={"colocated_choice": "prefix_load"}) as env:
            env.colo.delay = 0.05  # 60 tokens: a 3 s stream
            body = json.dumps(chat("hi", stream=True, max_tokens=60)).encode()
            headers = {**auth(), "Content-Type": "application/json"}
            async with env.session.post(env.base + "/v1/chat/completions", data=body, headers=headers) as r:
                assert r.headers["X-Pdfleet-Instance"] == "0"
                await r.content.readline()  # its first byte: decoding on instance 0
                _, h, _ = await env.post("/v1/chat/completions", chat("one"))  # rr 1: instance 1
                assert h["X-Pdfleet-Instance"] == "1"
                _, h, _ = await env.post("/v1/chat/completions", chat("two"))  # rr 2: instance 0's turn
                assert h["X-Pdfleet-Instance"] == "1"
                await r.read()
            _, h, _ = await env.post("/v1/chat/completions", chat("three"))  # rr 3: instance 1's turn
            _, h2, _ = await env.post("/v1/chat/completions", chat("four"))  # rr 4: instance 0's
            assert (h["X-Pdfleet-Instance"], h2["X-Pdfleet-Instance"]) == ("1", "0")
            assert env.gw is not None and env.gw.gateway.deciding.outstanding.streams == {}

    run(scenario())


def test_prefill_busy_from_the_scraped_queue_and_a_stopped_instance(tmp_path: Path) -> None:
    async def scenario() -> None:
        prefill = FakeMetrics()
        await prefill.start()
        settings = {"prefill_busy_waiting": 2, "poll_s": 0.1, "stale_s": 0.5}

        def models(colo: str, dis: str) -> dict[str, Any]:
            return {"llama": {"colocated": [colo], "disagg": dis, "prefill": [prefill.url]}}

        async def decision() -> str:
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 200
            return str(h["X-Pdfleet-Decision"])

        async def until(reason: str, within_s: float) -> float:
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            while await decision() != reason:
                assert loop.time() - t0 < within_s, f"no {reason} within {within_s} s"
                await asyncio.sleep(0.02)
            return loop.time() - t0

        try:
            # each change shows within a poll or two (0.1 s); 30 s: niced beside the lab, this process can
            # be starved for seconds
            async with Env(tmp_path, models=models, decider=settings) as env:
                await until("stage_weight", 30)  # the first scrape read an idle queue
                prefill.waiting = 3
                await until("prefill_busy", 30)
                prefill.waiting = 2  # at the bound, not past it
                await until("stage_weight", 30)
                await prefill.stop()
                await until("prefill_busy", 30)
                assert await env.metric("pdfleet_gateway_decisions_total", reason="prefill_busy") >= 2
        finally:
            await prefill.stop()

    run(scenario())


def test_policy_refuses_a_bound_with_nothing_to_scrape_and_a_stale_age_under_the_poll(tmp_path: Path) -> None:
    with pytest.raises(
        ValidationError, match=r"models\.llama\.prefill: decider\.prefill_busy_waiting is set"
    ):
        load_test_policy(tmp_path, decider={"prefill_busy_waiting": 4})
    with pytest.raises(ValidationError, match=r"decider.*stale_s \(0\.5\) must exceed poll_s \(1\)"):
        load_test_policy(tmp_path, decider={"stale_s": 0.5})
    with pytest.raises(ValidationError, match=r"decider\.colocated_choice"):
        load_test_policy(tmp_path, decider={"colocated_choice": "random"})
