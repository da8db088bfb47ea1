"""The gateway on loopback in front of fake upstreams: routing, errors, fallback, reload, streaming."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gw_fakes import ADMIN_KEY, LONG, USER_KEY, Env, auth, chat, sse_events


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _error(raw: bytes) -> dict[str, Any]:
    body = json.loads(raw)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


# ---- routing ---------------------------------------------------------------------------------


def test_long_goes_disagg_short_goes_colocated_streaming(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            st, h, raw = await env.post("/v1/chat/completions", chat(LONG, stream=True))
            assert st == 200 and h["X-Pdfleet-Pool"] == "disagg"
            events = sse_events(raw)
            assert events[-1] == "[DONE]" and len(events) == 9
            assert json.loads(events[0])["served_by"] == "dis"
            st, h, raw = await env.post("/v1/completions", {"model": "llama", "prompt": "hi", "stream": True})
            assert st == 200 and h["X-Pdfleet-Pool"] == "colocated"
            assert json.loads(sse_events(raw)[0])["served_by"] == "colo"
            assert (
                await env.metric(
                    "pdfleet_gateway_routing_decisions_total",
                    stage="long-all",
                    length_class="long",
                    pool="disagg",
                )
                == 1
            )
            assert await env.metric("pdfleet_gateway_requests_total", pool="colocated", status="200") == 1
            assert (
                await env.metric("pdfleet_gateway_ttft_seconds_count", pool="disagg", length_class="long")
                == 1
            )
            assert await env.metric("pdfleet_gateway_prompt_tokens_count") == 2

    run(scenario())


def test_body_forwarded_byte_for_byte_and_request_id_propagated(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            raw = (
                b'{"model": "llama",   "messages": [{"role":"user","content":"caf\\u00e9"}], "max_tokens": 2}'
            )
            st, h, _ = await env.post("/v1/chat/completions", None, {"X-Request-Id": "req-abc.1"}, raw=raw)
            assert st == 200 and h["X-Request-Id"] == "req-abc.1"
            seen = env.colo.seen[-1]
            assert seen["raw"] == raw
            assert seen["headers"]["X-Request-Id"] == "req-abc.1"
            assert "Authorization" not in seen["headers"]  # the client's key stays at the gateway
            st, h, _ = await env.post("/v1/chat/completions", chat(), {"X-Request-Id": "bad id with spaces"})
            assert st == 200 and h["X-Request-Id"] != "bad id with spaces"
            assert env.colo.seen[-1]["headers"]["X-Request-Id"] == h["X-Request-Id"]

    run(scenario())


def test_upstream_model_rewrite(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            env.policy["models"]["llama"]["upstream_model"] = "meta-llama/Llama-3.1-8B-Instruct"
            env.rewrite_policy(version=2)
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200
            st, _, raw = await env.post("/v1/chat/completions", chat())
            assert st == 200
            assert env.colo.seen[-1]["body"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"

    run(scenario())


def test_sticky_session_header_and_override(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, stage="half") as env:
            pools: dict[str, set[str]] = {}
            for i in range(40):
                sid = f"conv-{i % 10}"
                st, h, _ = await env.post("/v1/chat/completions", chat(), {"X-Session-Id": sid})
                assert st == 200
                pools.setdefault(sid, set()).add(h["X-Pdfleet-Pool"])
            assert all(len(p) == 1 for p in pools.values())
            assert {next(iter(p)) for p in pools.values()} == {"colocated", "disagg"}
            st, h, _ = await env.post("/v1/chat/completions", chat(), {"X-Pdfleet-Pool": "disagg"})
            assert h["X-Pdfleet-Pool"] == "disagg"
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG), {"X-Pdfleet-Pool": "colocated"})
            assert h["X-Pdfleet-Pool"] == "colocated"
            assert await env.metric("pdfleet_gateway_routing_decisions_total", reason="header") == 2

    run(scenario())


# ---- malformed input -------------------------------------------------------------------------

GOOD = json.dumps(chat()).encode()

MALFORMED: list[tuple[str, str, str, dict[str, str] | None, bytes | None, int, str]] = [
    # (case, method, path, headers (None: user key), body, status, message fragment)
    ("no auth header", "POST", "/v1/chat/completions", {}, GOOD, 401, "missing Authorization"),
    (
        "basic scheme",
        "POST",
        "/v1/chat/completions",
        {"Authorization": f"Basic {USER_KEY}"},
        GOOD,
        401,
        "Bearer",
    ),
    (
        "lead whitespace",
        "POST",
        "/v1/chat/completions",
        {"Authorization": f"Bearer  {USER_KEY}"},
        GOOD,
        401,
        "whitespace",
    ),
    (
        "unknown key",
        "POST",
        "/v1/chat/completions",
        {"Authorization": "Bearer sk-nope"},
        GOOD,
        401,
        "not valid",
    ),
    ("bearer no key", "POST", "/v1/completions", {"Authorization": "Bearer"}, GOOD, 401, "no key"),
    ("empty body", "POST", "/v1/chat/completions", None, b"", 400, "empty"),
    ("bad json", "POST", "/v1/chat/completions", None, b'{"model": ', 400, "not valid JSON"),
    ("not utf8", "POST", "/v1/chat/completions", None, b'{"model": "\xff\xfe"}', 400, "not valid JSON"),
    ("json array", "POST", "/v1/chat/completions", None, b"[1,2]", 400, "JSON object"),
    ("json string", "POST", "/v1/completions", None, b'"hi"', 400, "JSON object"),
    (
        "no model",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"messages": [{"role":"user","content":"x"}]}',
        400,
        "'model'",
    ),
    (
        "model not str",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": 3, "messages": []}',
        400,
        "must be a string",
    ),
    (
        "unknown model",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "gpt-9", "messages": []}',
        404,
        "available models: llama",
    ),
    ("no messages", "POST", "/v1/chat/completions", None, b'{"model": "llama"}', 400, "'messages'"),
    (
        "messages not list",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "llama", "messages": "hi"}',
        400,
        "'messages'",
    ),
    (
        "messages empty",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "llama", "messages": []}',
        400,
        "non-empty",
    ),
    (
        "message not object",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "llama", "messages": [1]}',
        400,
        "message objects",
    ),
    ("no prompt", "POST", "/v1/completions", None, b'{"model": "llama"}', 400, "'prompt'"),
    (
        "prompt object",
        "POST",
        "/v1/completions",
        None,
        b'{"model": "llama", "prompt": {"a": 1}}',
        400,
        "'prompt' must be",
    ),
    (
        "prompt nested deep",
        "POST",
        "/v1/completions",
        None,
        b'{"model": "llama", "prompt": ' + b"[" * 500 + b"]" * 500 + b"}",
        400,
        "'prompt' must be",
    ),
    (
        "stream not bool",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "llama", "messages": [{"role":"user"}], "stream": "yes"}',
        400,
        "'stream'",
    ),
    (
        "bad override",
        "POST",
        "/v1/chat/completions",
        {"Authorization": f"Bearer {USER_KEY}", "X-Pdfleet-Pool": "gpu7"},
        GOOD,
        400,
        "X-Pdfleet-Pool",
    ),
    (
        "too large",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "llama", "pad": "' + b"x" * 70000 + b'"}',
        413,
        "larger than",
    ),
    ("unknown path", "POST", "/v1/embeddings", None, GOOD, 404, "no such endpoint"),
    ("wrong method", "GET", "/v1/chat/completions", None, None, 405, "not allowed"),
    ("models no key", "GET", "/v1/models", {}, None, 401, "missing Authorization"),
    ("admin with user key", "GET", "/admin/policy", None, None, 403, "admin key"),
    ("reload with user key", "POST", "/admin/reload", None, None, 403, "admin key"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_requests_get_documented_status(tmp_path: Path, case) -> None:
    name, method, path, headers, body, status, fragment = case

    async def scenario() -> None:
        async with Env(tmp_path, max_body_bytes=65536) as env:
            hdrs = auth() if headers is None else headers
            async with env.session.request(method, env.base + path, data=body, headers=hdrs) as r:
                raw = await r.read()
                assert r.status == status, raw
            err = _error(raw)
            assert fragment in err["message"]
            assert USER_KEY not in err["message"]
            assert not env.colo.seen and not env.dis.seen  # nothing reached an upstream
            async with env.session.get(env.base + "/health") as r:
                assert r.status == 200
            st, _, _ = await env.post("/v1/chat/completions", chat())
            assert st == 200

    run(scenario())


def test_at_least_20_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


# ---- faults ------------------------------------------------------------------------------------


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
            assert st == 503 and "no pool can serve" in _error(raw)["message"]

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
            assert st == 504 and _error(raw)["code"] == "upstream_timeout"
            await env.colo.stop()
            await env.dis.stop()
            st, _, raw = await env.post("/v1/chat/completions", chat(LONG))
            assert st == 503 and _error(raw)["code"] == "upstream_unavailable"
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
            for _ in range(100):
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


# ---- reload ------------------------------------------------------------------------------------


def test_reload_under_200_streams_changes_nothing_in_flight(tmp_path: Path) -> None:
    n, tokens = 200, 30

    async def one(env: Env, i: int) -> tuple[str, str, list[str]]:
        body = chat(LONG if i % 2 else "short", stream=True, max_tokens=tokens)
        async with env.session.post(
            env.base + "/v1/chat/completions", json=body, headers={**auth(), "X-Session-Id": f"s{i}"}
        ) as r:
            assert r.status == 200
            raw = await r.read()
            return r.headers["X-Pdfleet-Pool"], r.headers["X-Pdfleet-Policy-Version"], sse_events(raw)

    async def scenario() -> None:
        conn = aiohttp.TCPConnector(limit=0)
        async with Env(tmp_path, delay=0.03) as env:
            await env.session.close()
            env.session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=60))
            tasks = [asyncio.create_task(one(env, i)) for i in range(n)]
            while len(env.colo.seen) + len(env.dis.seen) < n:
                await asyncio.sleep(0.01)
            env.rewrite_policy(version=2, stage="off")
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200 and (await r.json())["version"] == 2
            results = await asyncio.gather(*tasks)
            for i, (pool, version, events) in enumerate(results):
                assert version == "1"
                assert pool == ("disagg" if i % 2 else "colocated")
                assert len(events) == tokens + 1 and events[-1] == "[DONE]"  # not truncated
                assert all("error" not in e for e in events)
            assert env.colo.cancelled == env.dis.cancelled == 0
            st, h, _ = await env.post("/v1/chat/completions", chat(LONG))
            assert h["X-Pdfleet-Pool"] == "colocated" and h["X-Pdfleet-Policy-Version"] == "2"
            assert await env.metric("pdfleet_gateway_policy_info", version="2", stage="off") == 1

    run(scenario())


def test_bad_reload_keeps_old_policy(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            (tmp_path / "policy.yaml").write_text("version: 2\nstage: nope\nbogus: 1\n")
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 422
                msg = _error(await r.read())["message"]
            assert "version 1 stays active" in msg and "bogus: unknown key" in msg
            env.rewrite_policy(version=3)
            os.chmod(tmp_path / "keys.yaml", 0o644)
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 422 and "group/world-accessible" in _error(await r.read())["message"]
            os.chmod(tmp_path / "keys.yaml", 0o600)
            env.rewrite_policy(version=4, listen={"host": "127.0.0.1", "port": 1})
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 422 and "needs a restart" in _error(await r.read())["message"]
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                info = await r.json()
            assert info["version"] == 1 and info["last_reload"]["ok"] is False
            assert await env.metric("pdfleet_gateway_policy_reloads_total", result="rejected") == 3
            st, _, _ = await env.post("/v1/chat/completions", chat())
            assert st == 200

    run(scenario())


def test_models_health_admin(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            async with env.session.get(env.base + "/v1/models", headers=auth()) as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["llama"]
            async with env.session.get(env.base + "/health") as r:
                assert (await r.json())["policy_version"] == 1
            await env.post("/v1/chat/completions", chat(LONG))
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                info = await r.json()
            assert info["stage"] == "long-all" and info["counts"]["decisions"]["long"]["disagg"] == 1
            assert USER_KEY not in json.dumps(info) and "sha256" not in json.dumps(info["models"])

    run(scenario())


def test_separate_admin_port(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Env(tmp_path, listen={"host": "127.0.0.1", "port": 0, "admin_port": 0}) as env:
            assert env.gw is not None and env.gw.admin_port
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 404
            admin = f"http://127.0.0.1:{env.gw.admin_port}/admin/policy"
            async with env.session.get(admin, headers=auth(ADMIN_KEY)) as r:
                assert r.status == 200

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
