"""Intake: its pure steps (request id, body, fields, alias, override header, sticky key, forwarded bytes)
and, end to end on loopback, routing by length class and session and every request it rejects."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pdfleet.gateway.errors import Reject
from pdfleet.gateway.intake import (
    check_fields,
    forced_pool,
    parse_body,
    request_id,
    route_for,
    sticky_key,
    upstream_body,
)
from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    LONG,
    USER_KEY,
    Env,
    Malformed,
    auth,
    chat,
    check_malformed,
    load_test_policy,
    run,
    sse_events,
)


def _rejected(fn, *args) -> Reject:  # type: ignore[no-untyped-def]
    with pytest.raises(Reject) as exc:
        fn(*args)
    return exc.value


# ---- the pure steps ----------------------------------------------------------------------------


def test_request_id_keeps_a_sane_client_id_else_makes_one() -> None:
    assert request_id("req-abc.1:2") == "req-abc.1:2"
    for bad in (None, "", "bad id with spaces", "x" * 129, "a\nb"):
        rid = request_id(bad)
        assert len(rid) == 32 and int(rid, 16) >= 0
    assert request_id(None) != request_id(None)


def test_parse_body_takes_json_objects_only() -> None:
    assert parse_body(b'{"model": "llama", "n": [1, 2]}') == {"model": "llama", "n": [1, 2]}
    for body, fragment in [(b"", "empty"), (b"{", "not valid JSON"), (b"[1]", "JSON object")]:
        rej = _rejected(parse_body, body)
        assert rej.status == 400 and fragment in rej.message


def test_route_for_names_the_aliases_and_shortens_a_long_model_name(tmp_path: Path) -> None:
    policy = load_test_policy(tmp_path)
    alias, route = route_for(policy, {"model": "llama"})
    assert alias == "llama" and route is policy.routes["llama"]
    rej = _rejected(route_for, policy, {"model": "m" * 300})
    assert rej.status == 404 and rej.code == "model_not_found" and "m" * 201 not in rej.message
    assert "available models: llama" in rej.message


@pytest.mark.parametrize(
    "prompt", ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]], ids=["str", "strs", "ids", "id-lists"]
)
def test_check_fields_accepts_every_openai_prompt_shape(prompt: object) -> None:
    check_fields("completions", {"prompt": prompt, "stream": True})


@pytest.mark.parametrize(
    "prompt", [[], [True], ["a", 1], [[1], []], [[1.5]], {"a": 1}, 3], ids=lambda p: repr(p)[:12]
)
def test_check_fields_refuses_other_prompts(prompt: object) -> None:
    rej = _rejected(check_fields, "completions", {"prompt": prompt})
    assert rej.status == 400 and rej.param == "prompt"


def test_forced_pool_from_the_override_header(tmp_path: Path) -> None:
    policy = load_test_policy(tmp_path)
    route = policy.routes["llama"]
    assert forced_pool({}, policy, route) is None
    assert forced_pool({"X-Pdfleet-Pool": " Disagg "}, policy, route) == "disagg"
    assert _rejected(forced_pool, {"X-Pdfleet-Pool": "gpu7"}, policy, route).param == "X-Pdfleet-Pool"
    colo_only = load_test_policy(tmp_path, models={"llama": {"colocated": ["http://127.0.0.1:8001"]}})
    rej = _rejected(forced_pool, {"X-Pdfleet-Pool": "disagg"}, colo_only, colo_only.routes["llama"])
    assert "has no disagg pool" in rej.message
    off = load_test_policy(tmp_path, override_header=None)
    assert forced_pool({"X-Pdfleet-Pool": "disagg"}, off, off.routes["llama"]) is None


def test_sticky_key_prefers_session_then_user_then_key(tmp_path: Path) -> None:
    policy = load_test_policy(tmp_path)
    assert sticky_key({"X-Session-Id": "c1"}, policy, {"user": "u1"}, "d") == "s:c1"
    assert sticky_key({}, policy, {"user": "u1"}, "d") == "u:u1"
    assert sticky_key({}, policy, {"user": 7}, "d") == "k:d"
    no_user = load_test_policy(tmp_path, sticky={"use_user_field": False})
    assert sticky_key({}, no_user, {"user": "u1"}, "d") == "k:d"


def test_upstream_body_is_the_clients_bytes_unless_the_model_is_renamed(tmp_path: Path) -> None:
    body = b'{"model": "llama",  "x": 1}'
    route = load_test_policy(tmp_path).routes["llama"]
    assert upstream_body(route, "llama", json.loads(body), body) is body
    pol = load_test_policy(
        tmp_path, models={"llama": {"colocated": ["http://127.0.0.1:8001"], "upstream_model": "meta/L"}}
    )
    out = upstream_body(pol.routes["llama"], "llama", json.loads(body), body)
    assert json.loads(out) == {"model": "meta/L", "x": 1}


# ---- end to end: routing ---------------------------------------------------------------------


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


# ---- end to end: malformed input -------------------------------------------------------------

GOOD = json.dumps(chat()).encode()

MALFORMED: list[Malformed] = [
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
        "gzip on a plain body",
        "POST",
        "/v1/chat/completions",
        {"Authorization": f"Bearer {USER_KEY}", "Content-Encoding": "gzip"},
        GOOD,
        400,
        "Content-Encoding",
    ),
    (
        "deflate on a plain body",
        "POST",
        "/v1/chat/completions",
        {"Authorization": f"Bearer {USER_KEY}", "Content-Encoding": "deflate"},
        GOOD,
        400,
        "Content-Encoding",
    ),
    (
        "lone surrogate",
        "POST",
        "/v1/chat/completions",
        None,
        b'{"model": "llama", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
        400,
        "unpaired UTF-16 surrogate",
    ),
    (
        "lone low surrogate in a key",
        "POST",
        "/v1/completions",
        None,
        b'{"model": "llama", "prompt": "p", "\\udc00": 1}',
        400,
        "unpaired UTF-16 surrogate",
    ),
    (
        "1020 deep beside the prompt",  # within orjson's parse limit, beyond every encoder's
        "POST",
        "/v1/completions",
        None,
        b'{"model": "llama", "prompt": "p", "x": ' + b"[" * 1020 + b"]" * 1020 + b"}",
        400,
        "nested too deeply",
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
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_requests_get_documented_status(tmp_path: Path, case: Malformed) -> None:
    run(check_malformed(tmp_path, case))


def test_at_least_20_malformed_cases() -> None:
    assert len(MALFORMED) >= 20


def test_a_gzip_body_is_decoded_and_a_deep_one_forwarded_when_it_can_be(tmp_path: Path) -> None:
    # the happy side of the Content-Encoding and re-encoding cases above
    async def scenario() -> None:
        async with Env(tmp_path, upstream_model="meta/llama") as env:
            st, _, _ = await env.post(
                "/v1/chat/completions", None, {"Content-Encoding": "gzip"}, raw=gzip.compress(GOOD)
            )
            assert st == 200 and env.colo.seen[-1]["body"]["messages"] == chat()["messages"]
            deep = b'{"model": "llama", "prompt": "p", "x": ' + b"[" * 300 + b"]" * 300 + b"}"
            st, _, _ = await env.post("/v1/completions", None, raw=deep)  # past orjson's 255 to encode
            assert st == 200 and env.colo.seen[-1]["body"]["model"] == "meta/llama"

    run(scenario())
