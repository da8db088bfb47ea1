"""The proxy: the order of attempts and, end to end on loopback, fallback before the first byte, errors
after it, client disconnects, stall metrics and unframed HTTP/1.0 streaming."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest

from pdfleet.gateway.context import RequestContext
from pdfleet.gateway.policy import ActivePolicy, Decision
from pdfleet.gateway.proxy import attempts
from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    LONG,
    USER_KEY,
    Env,
    RawServer,
    auth,
    chat,
    error_of,
    load_test_policy,
    run,
    sse_events,
)


def _ctx(policy: ActivePolicy, decision: Decision) -> RequestContext:
    """A request for `llama` that intake sent where `decision` says."""
    route = policy.routes["llama"]
    data = {"model": "llama", "prompt": "hi"}
    key = next(iter(policy.keys.values()))
    return RequestContext(
        "r1", 0.0, policy, key, "completions", "llama", route, data, b"{}", False, 1, "short", decision
    )


# ---- attempts ----------------------------------------------------------------------------------


def test_disagg_is_retried_once_on_colocated_unless_forced(tmp_path: Path) -> None:
    policy = load_test_policy(tmp_path)
    assert attempts(_ctx(policy, Decision("disagg", "stage_weight", 1))) == [
        ("disagg", "http://127.0.0.1:8090"),
        ("colocated", "http://127.0.0.1:8001"),
    ]
    forced = Decision("disagg", "forced_header", 1)
    assert attempts(_ctx(policy, forced)) == [("disagg", "http://127.0.0.1:8090")]


def test_colocated_goes_to_the_decided_instance_and_retries_on_the_next_one(tmp_path: Path) -> None:
    two = ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    policy = load_test_policy(tmp_path, models={"llama": {"colocated": two}})
    for i in (0, 1):
        tries = attempts(_ctx(policy, Decision("colocated", "stage_weight", 1, instance=i)))
        assert tries == [("colocated", two[i]), ("colocated", two[1 - i])]
    one = load_test_policy(tmp_path)
    assert attempts(_ctx(one, Decision("colocated", "short", 1))) == [("colocated", "http://127.0.0.1:8001")]


# ---- end to end: faults ------------------------------------------------------------------------


def test_disagg_down_falls_back_and_is_counted(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.001) as env:
            await env.dis.stop()  # the disaggregated pool's upstream is gone: connection refused
            for stream in (True, False):
                st, h, raw = await env.post("/v1/chat/completions", chat(LONG, stream=stream))
                assert st == 200 and h["X-Pdfleet-Pool"] == "colocated" and h["X-Pdfleet-Fallback"] == "1"
                if stream:
                    assert sse_events(raw)[-1] == "[DONE]"
                else:
                    assert json.loads(raw)["served_by"] == "colo"
            assert await env.metric("pdfleet_gateway_fallbacks_total", reason="connect") == 2
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                assert (await r.json())["counts"]["fallbacks"] == {"connect": 2}
            # forcing the dead pool by header shows the failure instead of hiding it
            st, _, raw = await env.post("/v1/chat/completions", chat(), {"X-Pdfleet-Pool": "disagg"})
            assert st == 503 and "no pool can serve" in error_of(raw)["message"]

    run(scenario())


def test_the_serving_colocated_instance_is_named_by_its_position_also_on_a_fallback(tmp_path: Path) -> None:
    # the bench attributes a stream to the long prefills on its own instance by this header
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.001) as env:
            with socket.socket() as s:  # a port nothing listens on: connection refused
                s.bind(("127.0.0.1", 0))
                dead = f"http://127.0.0.1:{s.getsockname()[1]}"
            env.policy["models"]["llama"]["colocated"] = [dead, env.colo.url]
            env.rewrite_policy(version=env.policy["version"] + 1)
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            for _ in range(2):  # round robin: instance 1 answers, instance 0 fails over to instance 1
                st, h, raw = await env.post("/v1/chat/completions", chat(stream=True))
                assert st == 200 and h["X-Pdfleet-Pool"] == "colocated", raw
                assert h["X-Pdfleet-Instance"] == "1" and env.colo.url not in h["X-Pdfleet-Instance"]
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))  # the P/D pool: no instance
            assert st == 200 and h["X-Pdfleet-Pool"] == "disagg" and "X-Pdfleet-Instance" not in h
            await env.dis.stop()  # the P/D pool's fallback names the colocated instance that served it
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert h["X-Pdfleet-Fallback"] == "1" and h["X-Pdfleet-Instance"] == "1"

    run(scenario())


def test_disagg_5xx_and_timeout_fall_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, timeouts={"connect_s": 1, "first_byte_s": 0.5, "idle_s": 5}) as env:
            env.dis.mode = "500"
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG, stream=True))
            assert st == 200 and h["X-Pdfleet-Pool"] == "colocated"
            env.dis.mode = "hang"
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 200 and h["X-Pdfleet-Pool"] == "colocated"
            assert await env.metric("pdfleet_gateway_fallbacks_total", reason="status_5xx") == 1
            assert await env.metric("pdfleet_gateway_fallbacks_total", reason="timeout") == 1

    run(scenario())


def test_no_pool_503_and_timeout_504(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, timeouts={"connect_s": 1, "first_byte_s": 0.3, "idle_s": 5}) as env:
            env.colo.mode = "hang"
            st, _, raw = await env.post("/v1/chat/completions", chat())
            assert st == 504 and error_of(raw)["code"] == "upstream_timeout"
            await env.colo.stop()
            await env.dis.stop()
            st, _, raw = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 503 and error_of(raw)["code"] == "upstream_unavailable"
            async with env.session.get(env.base + "/health") as r:
                assert r.status == 200

    run(scenario())


def test_colocated_5xx_without_alternative_is_passed_through(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            env.colo.mode = "500"
            st, _, raw = await env.post("/v1/chat/completions", chat())
            assert st == 500 and json.loads(raw)["error"]["message"] == "engine dead"

    run(scenario())


def test_empty_upstream_body_still_gets_status_and_headers(tmp_path: Path) -> None:
    # the gateway holds its response headers back to send them with the first chunk: with no chunk
    # at all they must still go out when the response ends
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            env.colo.mode = "empty"
            for stream in (False, True):
                st, h, raw = await env.post("/v1/chat/completions", chat(stream=stream))
                assert st == 200 and raw == b""
                assert h["X-Pdfleet-Pool"] == "colocated" and h["X-Request-Id"]

    run(scenario())


def test_stream_broken_after_first_byte_ends_with_error_event(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            env.dis.mode = "cut"
            st, h, raw = await env.post("/v1/chat/completions", chat(LONG, stream=True))
            assert st == 200 and h["X-Pdfleet-Pool"] == "disagg"  # no fallback once bytes were sent
            events = sse_events(raw)
            assert events[-1] != "[DONE]"
            assert "error" in json.loads(events[-1])
            assert len(events) == 3  # the two chunks sent before the cut, then the error event
            assert await env.metric("pdfleet_gateway_stream_errors_total", pool="disagg") == 1
            env.colo.mode = "cut"
            with pytest.raises(aiohttp.ClientPayloadError):
                await env.post("/v1/chat/completions", chat(stream=False, max_tokens=400))

    run(scenario())


@pytest.mark.procs  # the OpenAI SDK runs `uname` once (its platform headers)
def test_a_stream_cut_mid_event_gives_the_sdk_the_api_error(tmp_path: Path) -> None:
    """N9: the gateway completed the half event with its `\\n\\n`, so the SDK raised JSONDecodeError on
    the half JSON instead of the API error; now only whole events reach the client before the error."""
    import openai

    async def scenario() -> None:
        async with Env(tmp_path) as env:
            env.colo.mode = env.dis.mode = "cut-mid-event"
            client = openai.AsyncOpenAI(base_url=env.base + "/v1", api_key=USER_KEY, max_retries=0)
            for prompt in ("hello", LONG):  # the colocated pool and the disaggregated one
                stream = await client.chat.completions.create(
                    model="llama", messages=[{"role": "user", "content": prompt}], stream=True, max_tokens=8
                )
                got = []
                with pytest.raises(openai.APIError, match="upstream failed mid-stream"):
                    async for chunk in stream:
                        got.append(chunk.choices[0].delta.content)
                assert got == ["t0 ", "t1 "]  # the whole events before the cut
            await client.close()

    run(scenario())


def test_a_client_that_leaves_after_the_last_event_was_served(tmp_path: Path) -> None:
    """The OpenAI SDK closes its connection on `[DONE]`, before the body's end marker: a whole answer
    delivered is a served request, not a client gone (the shadow series count it ok)."""

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.0) as env:
            env.colo.end_delay = 0.3  # the upstream ends its body well after [DONE]
            async with env.session.post(
                env.base + "/v1/chat/completions", headers=auth(), json=chat(stream=True, max_tokens=3)
            ) as r:
                seen = b""
                while b"[DONE]" not in seen:
                    seen += await r.content.readany()
                r.close()  # gone before the end of the body
            # up to 30 s, not a fixed second: niced beside the lab, this process can be starved that long
            for _ in range(1500):
                if env.colo.cancelled or env.colo.finished:  # the gateway saw it leave
                    break
                await asyncio.sleep(0.02)
            assert env.colo.cancelled + env.colo.finished == 1
            assert await env.metric("pdfleet_gateway_client_disconnects_total", pool="colocated") == 0

    run(scenario())


def test_idle_timeout_mid_stream_ends_with_error_event(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(
            tmp_path, delay=0.0, timeouts={"connect_s": 1, "first_byte_s": 5, "idle_s": 0.3}
        ) as env:
            env.colo.delay = 1.0  # first chunk arrives after 1 s (< first_byte_s), then gaps of 1 s > idle_s
            st, _, raw = await env.post("/v1/chat/completions", chat(stream=True, max_tokens=3))
            events = sse_events(raw)
            assert st == 200 and "timed out" in json.loads(events[-1])["error"]["message"]

    run(scenario())


def test_client_gone_closes_upstream_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.05) as env:
            async with env.session.post(
                env.base + "/v1/chat/completions", headers=auth(), json=chat(stream=True, max_tokens=2000)
            ) as r:
                assert r.status == 200
                await r.content.readany()
                r.close()  # drop the connection mid-stream
            # up to 30 s (the stream alone would take 100 s): niced beside the lab, this process can be
            # starved for seconds
            for _ in range(1500):
                if env.colo.cancelled:
                    break
                await asyncio.sleep(0.02)
            assert env.colo.cancelled == 1 and env.colo.finished == 0
            assert await env.metric("pdfleet_gateway_client_disconnects_total", pool="colocated") == 1
            assert await env.metric("pdfleet_gateway_in_flight_requests") == 0

    run(scenario())


def test_stalls_and_gaps_are_measured(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.06, stall_threshold_ms=40) as env:
            st, _, _ = await env.post("/v1/chat/completions", chat(stream=True, max_tokens=4))
            assert st == 200
            # 4 chunks 60 ms apart plus [DONE]: 3 gaps over the 40 ms threshold (the first chunk is TTFT)
            assert await env.metric("pdfleet_gateway_stream_stalls_total", pool="colocated") >= 3
            assert await env.metric("pdfleet_gateway_chunk_gap_seconds_count", pool="colocated") >= 3

    run(scenario())


def test_http10_client_gets_the_stream_unframed_then_close(tmp_path: Path) -> None:
    # no chunked encoding for HTTP/1.0: the relay writes the upstream's payload as it is, and the end
    # of the body is the end of the connection
    async def scenario() -> None:
        async with Env(tmp_path, delay=0.005) as env:
            body = json.dumps(chat(stream=True, max_tokens=5)).encode()
            reader, writer = await asyncio.open_connection("127.0.0.1", env.gw.port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.0\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (USER_KEY.encode(), len(body), body)
            )
            raw = await asyncio.wait_for(reader.read(), 10)  # until the gateway closes
            writer.close()
            head, _, payload = raw.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 200") or head.startswith(b"HTTP/1.1 200")
            assert b"transfer-encoding" not in head.lower()
            events = sse_events(payload)
            assert len(events) == 6 and events[-1] == "[DONE]"
            assert all(json.loads(e)["choices"] for e in events[:-1])

    run(scenario())


_BODY = b'{"choices": []}'
BAD_UPSTREAM_HEADS = [  # (id, what the colocated upstream answers): nothing of it may reach the client
    (
        "header-bare-lf",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\nX-A: 1\r\nContent-Length: 15\r\n\r\n",
    ),
    (
        "header-bare-cr",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\rX-A: 1\r\nContent-Length: 15\r\n\r\n",
    ),
    ("header-nul", b"HTTP/1.1 200 OK\r\nContent-Type: application/\x00json\r\nContent-Length: 15\r\n\r\n"),
    ("status-000", b"HTTP/1.1 000 Zero\r\nContent-Length: 15\r\n\r\n"),
    ("status-099", b"HTTP/1.1 099 Low\r\nContent-Length: 15\r\n\r\n"),
    ("status-999", b"HTTP/1.1 999 High\r\nContent-Length: 15\r\n\r\n"),
]


async def _point_at(env: Env, colocated: str, disagg: str) -> None:
    """Reload the gateway with other pool URLs."""
    env.policy["models"]["llama"].update(colocated=[colocated], disagg=disagg)
    env.rewrite_policy(version=env.policy["version"] + 1)
    async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
        assert r.status == 200


@pytest.mark.parametrize("head", [c[1] for c in BAD_UPSTREAM_HEADS], ids=[c[0] for c in BAD_UPSTREAM_HEADS])
def test_an_invalid_upstream_head_is_a_counted_502_or_a_fallback(tmp_path: Path, head: bytes) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env, RawServer(lambda _req: [head + _BODY]) as bad:
            await _point_at(env, bad.url, env.dis.url)
            for stream in (False, True):  # short prompts: the colocated pool, no other to fall back to
                st, h, raw = await env.post("/v1/chat/completions", chat(stream=stream))
                assert st == 502, raw
                err = error_of(raw)
                assert err["code"] == "upstream_error" and err["type"] == "upstream_error"
                assert "invalid HTTP response" in err["message"] and h["X-Request-Id"]
            assert await env.metric("pdfleet_gateway_requests_total", pool="colocated", status="502") == 2
            await _point_at(env, env.colo.url, bad.url)  # the disaggregated pool answers badly: fall back
            st, h, raw = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 200 and h["X-Pdfleet-Pool"] == "colocated" and h["X-Pdfleet-Fallback"] == "1"
            assert await env.metric("pdfleet_gateway_fallbacks_total", reason="bad_response") == 1

    run(scenario())
