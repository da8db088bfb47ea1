"""Real clients through the gateway: the OpenAI Python SDK, and hypothesis-generated JSON bodies."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import openai
import pytest
from gw_fakes import ADMIN_KEY, LONG, USER_KEY, Env, LoopThread
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


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
