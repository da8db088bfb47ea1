"""The app end to end on loopback: reload under load and rejected reloads, /v1/models, /health, admin
endpoints and the admin port, dispatch errors; and real clients through it: the OpenAI Python SDK and
hypothesis-generated JSON bodies."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    LONG,
    USER_KEY,
    Env,
    LoopThread,
    Malformed,
    auth,
    chat,
    check_malformed,
    error_of,
    raw_exchange,
    run,
    sse_events,
)

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
                msg = error_of(await r.read())["message"]
            assert "version 1 stays active" in msg and "bogus: unknown key" in msg
            env.rewrite_policy(version=3)
            os.chmod(tmp_path / "keys.yaml", 0o644)
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 422 and "group/world-accessible" in error_of(await r.read())["message"]
            os.chmod(tmp_path / "keys.yaml", 0o600)
            env.rewrite_policy(version=4, listen={"host": "127.0.0.1", "port": 1})
            async with env.session.post(env.base + "/admin/reload", headers=auth(ADMIN_KEY)) as r:
                assert r.status == 422 and "needs a restart" in error_of(await r.read())["message"]
            async with env.session.get(env.base + "/admin/policy", headers=auth(ADMIN_KEY)) as r:
                info = await r.json()
            assert info["version"] == 1 and info["last_reload"]["ok"] is False
            assert await env.metric("pdfleet_gateway_policy_reloads_total", result="rejected") == 3
            st, _, _ = await env.post("/v1/chat/completions", chat())
            assert st == 200

    run(scenario())


# ---- small endpoints and errors -----------------------------------------------------------------


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


APP_ERRORS: list[Malformed] = [
    ("unknown path", "POST", "/v1/embeddings", None, json.dumps(chat()).encode(), 404, "no such endpoint"),
    ("wrong method", "GET", "/v1/chat/completions", None, None, 405, "not allowed"),
    ("models no key", "GET", "/v1/models", {}, None, 401, "missing Authorization"),
    ("admin with user key", "GET", "/admin/policy", None, None, 403, "admin key"),
    ("reload with user key", "POST", "/admin/reload", None, None, 403, "admin key"),
]


@pytest.mark.parametrize("case", APP_ERRORS, ids=[c[0] for c in APP_ERRORS])
def test_malformed_requests_get_documented_status(tmp_path: Path, case: Malformed) -> None:
    # unknown paths and methods (dispatch) and endpoints the key has no right to
    run(check_malformed(tmp_path, case))


def test_every_response_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the gateway's own errors too: unknown paths, wrong methods, small endpoints, protocol errors and
    # a failure inside the gateway (injected: no input is known to cause one)
    async def scenario() -> None:
        async with Env(tmp_path) as env:
            total = "pdfleet_gateway_requests_total"
            before = await env.metric(total)
            answered = []
            for method, path, headers in [
                ("GET", "/nope", {}),
                ("GET", "/v1/chat/completions", auth()),
                ("GET", "/v1/models", auth()),
                ("GET", "/v1/models", {}),
                ("GET", "/health", {}),
                ("GET", "/admin/policy", auth()),
            ]:
                async with env.session.request(method, env.base + path, headers=headers) as r:
                    answered.append(r.status)
            status, _ = await asyncio.to_thread(
                raw_exchange, env.gw.port, b"GET /health HTTP/1.1\r\nBad Header: x\r\n\r\n"
            )
            answered.append(status)

            async def boom(*_args: object) -> None:
                raise RuntimeError("injected")

            monkeypatch.setattr(env.gw.gateway.proxy, "forward", boom)
            st, _, raw = await env.post("/v1/chat/completions", chat())
            answered.append(st)
            assert answered == [404, 405, 200, 401, 200, 403, 400, 500], answered
            # + 1: the scrape that read `before` is counted once it is answered
            assert await env.metric(total) == before + len(answered) + 1
            assert await env.metric(total, status="500") == 1
            assert await env.metric(total, model="-", status="404") == 1

    run(scenario())


# ---- real clients: the OpenAI SDK and random JSON bodies, against one shared gateway -------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """One gateway plus fake upstreams on a background loop, shared by this module's tests."""
    loop = LoopThread()
    e = Env(tmp_path_factory.mktemp("gw"), delay=0.002)
    loop.run(e.__aenter__)
    try:
        yield e
    finally:
        loop.run(lambda: e.__aexit__(None, None, None))
        loop.close()


def _client(env: Env, key: str = USER_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=env.base + "/v1", api_key=key, max_retries=0, timeout=30)


def test_sdk_chat_stream_and_non_stream(env: Env) -> None:
    client = _client(env)
    got = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert got.choices[0].message.content == "t0 t1 t2 t3 t4 "
    stream = client.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": LONG}], max_tokens=6, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert text == "t0 t1 t2 t3 t4 t5 "


def test_sdk_completions_stream_and_non_stream(env: Env) -> None:
    client = _client(env)
    got = client.completions.create(model="llama", prompt="hello", max_tokens=3)
    assert got.choices[0].text == "t0 t1 t2 "
    text = "".join(
        c.choices[0].text
        for c in client.completions.create(model="llama", prompt=["a", "b"], max_tokens=4, stream=True)
    )
    assert text == "t0 t1 t2 t3 "


def test_sdk_raw_response_headers_and_models(env: Env) -> None:
    client = _client(env)
    raw = client.chat.completions.with_raw_response.create(
        model="llama",
        messages=[{"role": "user", "content": LONG}],
        max_tokens=1,
        extra_headers={"X-Request-Id": "sdk-req-1"},
    )
    assert raw.headers["x-request-id"] == "sdk-req-1" and raw.headers["x-pdfleet-pool"] == "disagg"
    assert [m.id for m in client.models.list()] == ["llama"]


def test_sdk_errors_are_typed(env: Env) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        _client(env, "sk-wrong").chat.completions.create(
            model="llama", messages=[{"role": "user", "content": "x"}]
        )
    assert "not valid" in exc.value.message and "sk-wrong" not in exc.value.message
    with pytest.raises(openai.NotFoundError, match="available models: llama"):
        _client(env).chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError, match="messages"):
        _client(env).chat.completions.create(model="llama", messages=[])


def test_sdk_sees_mid_stream_failure(env: Env) -> None:
    env.dis.mode = "cut"
    try:
        stream = _client(env).chat.completions.create(
            model="llama", messages=[{"role": "user", "content": LONG}], max_tokens=6, stream=True
        )
        with pytest.raises(openai.APIError, match="mid-stream"):
            for _ in stream:
                pass
    finally:
        env.dis.mode = "ok"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
_bodies = st.one_of(
    _json,
    st.fixed_dictionaries(
        {"model": st.sampled_from(["llama", "other", ""]) | _json},
        optional={
            "messages": _json,
            "prompt": _json,
            "stream": _json,
            "user": _json,
            "max_tokens": st.just(1),
        },
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_random_json_bodies_never_get_a_gateway_5xx(env: Env, body: object, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", env.gw.port, timeout=30)  # type: ignore[union-attr]
    try:
        conn.request(
            "POST",
            path,
            body=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {USER_KEY}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    assert resp.status < 500, raw
    if resp.status >= 400:
        assert json.loads(raw)["error"]["message"]


def test_gateway_still_healthy_after_fuzzing(env: Env) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", env.gw.port, timeout=10)  # type: ignore[union-attr]
    conn.request("GET", "/admin/policy", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["counts"]["in_flight"] == 0
