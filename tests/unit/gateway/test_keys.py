"""Keys file rules (mode, schema, no secrets in errors) and authentication messages; named keys with
scopes, their own limits and expiry (issue 28) through the real gateway on loopback and the OpenAI SDK."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import authenticate, authenticate_anthropic, hash_key, load_keys
from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    COLO,
    DIS,
    USER_KEY,
    Env,
    assert_no_key,
    auth,
    chat,
    error_of,
    load_test_policy,
    policy_dict,
    policy_error,
    run,
    write_keys,
)

STAGE_KEY = "sk-controller-5555aaaa5555"
OLD_KEY, NEW_KEY = "sk-app-old-1111111111", "sk-app-new-2222222222"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_keys_file_readable_by_others_refused(tmp_path: Path, mode: int) -> None:
    write_keys(tmp_path / "keys.yaml", mode)
    msg = policy_error(tmp_path, policy_dict(COLO, DIS))
    assert "group/world-accessible" in msg
    assert f"chmod 600 {tmp_path / 'keys.yaml'}" in msg


def test_keys_file_0400_accepted(tmp_path: Path) -> None:
    write_keys(tmp_path / "keys.yaml", 0o400)
    assert len(load_test_policy(tmp_path).keys) == 2


def test_keys_file_schema_errors(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"name": "a", "sha256": "not-hex", "root": True}]}))
    os.chmod(path, 0o600)
    with pytest.raises(ValidationError) as exc:
        load_keys(path)
    msg = str(exc.value)
    assert f"{path}: keys[0].sha256: must match ^[0-9a-f]{{64}}$" in msg
    assert f"{path}: keys[0].root: unknown key" in msg
    assert "not-hex" not in msg, "a keys file's values (hashes, or a key pasted by mistake) are never echoed"
    h = hash_key("k")
    path.write_text(yaml.safe_dump({"keys": [{"name": "a", "sha256": h}, {"name": "b", "sha256": h}]}))
    with pytest.raises(ValidationError, match=r"keys\[1\].sha256: the same key hash appears twice"):
        load_keys(path)


def test_keys_yaml_error_does_not_quote_content(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text("keys: [ {name: secretish-value\n")
    os.chmod(path, 0o600)
    with pytest.raises(ValidationError) as exc:
        load_keys(path)
    assert "secretish" not in str(exc.value)


def test_authenticate_messages_never_echo_the_key(tmp_path: Path) -> None:
    keys = load_test_policy(tmp_path).keys
    cases = {
        None: "missing Authorization header",
        f"Basic {USER_KEY}": "must use the Bearer scheme",
        f"Token {USER_KEY}": "must use the Bearer scheme",
        "Bearer": "no key after it",
        "Bearer ": "no key after it",
        f"Bearer  {USER_KEY}": "leading or trailing whitespace",
        f"Bearer {USER_KEY}\t": "leading or trailing whitespace",
        "Bearer sk-wrong-key-123": "not valid for this gateway",
    }
    for header, expected in cases.items():
        result = authenticate(header, keys)
        assert result.entry is None and result.error is not None
        assert expected in result.error
        assert USER_KEY not in result.error and "sk-wrong" not in result.error
    ok = authenticate(f"Bearer {USER_KEY}", keys)
    assert ok.entry is not None and ok.entry.name == "user" and not ok.entry.admin
    assert authenticate(f"bearer {ADMIN_KEY}", keys).entry.admin  # type: ignore[union-attr]


def test_anthropic_clients_send_x_api_key_or_bearer(tmp_path: Path) -> None:
    keys = load_test_policy(tmp_path).keys
    ok = authenticate_anthropic(USER_KEY, None, keys)
    assert ok.entry is not None and ok.entry.name == "user"
    assert authenticate_anthropic(None, f"Bearer {ADMIN_KEY}", keys).entry.admin  # type: ignore[union-attr]
    # x-api-key wins over Authorization, as the key an Anthropic client means
    assert authenticate_anthropic("sk-wrong", f"Bearer {USER_KEY}", keys).entry is None
    cases = {
        (None, None): "missing API key; send it as 'x-api-key: <key>'",
        ("", None): "the x-api-key header is empty",
        (f" {USER_KEY}", None): "leading or trailing whitespace",
        ("sk-wrong-key-123", None): "not valid for this gateway",
        (None, "sk-wrong-key-123"): "must use the Bearer scheme",
    }
    for (api_key, authorization), expected in cases.items():
        result = authenticate_anthropic(api_key, authorization, keys)
        assert result.entry is None and result.error is not None and expected in result.error
        assert USER_KEY not in result.error and "sk-wrong" not in result.error


def _keys(directory: Path, *more: dict[str, Any]) -> None:
    """The test keys file (user, admin) plus `more` entries, 0600."""
    base = [
        {"name": "user", "sha256": hash_key(USER_KEY)},
        {"name": "admin", "sha256": hash_key(ADMIN_KEY), "admin": True},
    ]
    (directory / "keys.yaml").write_text(yaml.safe_dump({"keys": [*base, *more]}))
    os.chmod(directory / "keys.yaml", 0o600)


def _two_models(colo: str, dis: str) -> dict[str, Any]:
    return {"llama": {"colocated": [colo], "disagg": dis}, "mistral": {"colocated": [colo], "disagg": dis}}


def test_a_name_repeats_only_for_a_rotation(tmp_path: Path) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    _keys(
        tmp_path,
        {"name": "app", "sha256": hash_key(OLD_KEY), "expires": soon},
        {"name": "app", "sha256": hash_key(NEW_KEY)},
    )
    assert len(load_test_policy(tmp_path).keys) == 4
    _keys(
        tmp_path, {"name": "app", "sha256": hash_key(OLD_KEY)}, {"name": "app", "sha256": hash_key(NEW_KEY)}
    )
    assert "every entry of it but one has expires" in policy_error(tmp_path, policy_dict(COLO, DIS))
    _keys(
        tmp_path,
        {"name": "ctl", "sha256": hash_key(OLD_KEY), "scope": "stage", "limits": {"concurrent_streams": 1}},
    )
    assert "keys[2]: limits: only a client key carries its own limits" in policy_error(
        tmp_path, policy_dict(COLO, DIS)
    )
    _keys(tmp_path, {"name": "app", "sha256": hash_key(OLD_KEY), "limits": {"models": ["gpt-9"]}})
    msg = policy_error(tmp_path, policy_dict(COLO, DIS))
    assert "'gpt-9' is not a model alias (aliases: llama)" in msg and str(tmp_path / "keys.yaml") in msg
    pol = policy_dict(COLO, DIS, limits={"keys": {"app": {"concurrent_streams": 2}}})
    assert "the key 'app' has limits here and in" in policy_error(tmp_path, pol)


@pytest.mark.procs  # the OpenAI SDK runs `uname` once (its platform headers)
def test_a_scoped_key_is_refused_on_another_model_naming_nothing_secret(tmp_path: Path) -> None:
    import openai

    _keys(tmp_path, {"name": "team-a", "sha256": hash_key(NEW_KEY), "limits": {"models": ["llama"]}})

    async def scenario() -> None:
        async with Env(tmp_path, models=_two_models) as env:
            client = openai.AsyncOpenAI(base_url=env.base + "/v1", api_key=NEW_KEY, max_retries=0)
            got = await client.chat.completions.create(
                model="llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert got.choices[0].message.content == "t0 t1 "
            with pytest.raises(openai.PermissionDeniedError) as err:
                await client.chat.completions.create(
                    model="mistral", messages=[{"role": "user", "content": "hi"}]
                )
            body = err.value.body
            assert isinstance(body, dict) and body["code"] == "model_not_allowed"
            assert body["message"] == "the key 'team-a' may not use model 'mistral'; its models: llama"
            assert [m.id async for m in client.models.list()] == ["llama"]  # it sees what it may use
            assert_no_key(json.dumps(body))
            await client.close()

    run(scenario())


@pytest.mark.procs
def test_a_rotated_out_key_stops_after_its_grace_while_its_stream_finishes(tmp_path: Path) -> None:
    """Both keys work during the grace period; past it the old one is refused by the gateway itself, and
    the reload that then removes it (what provision does) leaves the stream opened with it running."""
    import openai

    async def scenario() -> None:
        async with Env(tmp_path, delay=0.1) as env:
            assert env.gw is not None
            # the grace leaves seconds for the requests made in it (~0.6 s), which niced beside the lab can
            # take that much longer
            ends = datetime.now(UTC) + timedelta(seconds=4)
            new = {"name": "app", "sha256": hash_key(NEW_KEY)}
            _keys(tmp_path, {"name": "app", "sha256": hash_key(OLD_KEY), "expires": ends.isoformat()}, new)
            assert (await env.gw.gateway.reload())[0]
            old_client = openai.AsyncOpenAI(base_url=env.base + "/v1", api_key=OLD_KEY, max_retries=0)
            new_client = openai.AsyncOpenAI(base_url=env.base + "/v1", api_key=NEW_KEY, max_retries=0)
            ask = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            stream = await old_client.chat.completions.create(**{**ask, "max_tokens": 300}, stream=True)

            async def text() -> str:
                return "".join([c.choices[0].delta.content or "" async for c in stream])

            # 300 events 0.1 s apart: it outlives the grace and what follows, however slowly that runs
            streaming = asyncio.create_task(text())
            for client in (old_client, new_client):
                assert (await client.chat.completions.create(**ask)).choices[0].message.content == "t0 t1 "
            await asyncio.sleep((ends - datetime.now(UTC)).total_seconds() + 0.1)
            with pytest.raises(openai.AuthenticationError, match="not valid for this gateway"):
                await old_client.chat.completions.create(**ask)
            _keys(tmp_path, new)  # the next provision leaves the expired entry out
            assert (await env.gw.gateway.reload())[0]
            assert (await new_client.chat.completions.create(**ask)).choices[0].message.content == "t0 t1 "
            assert not streaming.done()
            env.colo.delay = 0.0  # the rest of the stream at once
            assert await streaming == "".join(f"t{i} " for i in range(300))
            await old_client.close()
            await new_client.close()

    run(scenario())


def test_the_controller_key_sets_the_stage_and_nothing_else(tmp_path: Path) -> None:
    _keys(tmp_path, {"name": "controller", "sha256": hash_key(STAGE_KEY), "scope": "stage"})

    async def scenario() -> None:
        async with Env(tmp_path) as env:
            get = env.session.get
            async with get(env.base + "/admin/policy", headers=auth(STAGE_KEY)) as r:
                assert r.status == 200 and (await r.json())["stage"] == "long-all"
            stage = {"version": 2, "stage": "half", "stages": env.policy["stages"]}
            status, _, raw = await env.post("/admin/stage", stage, headers=auth(STAGE_KEY))
            assert (status, json.loads(raw)["stage"]) == (200, "half")
            async with get(env.base + "/admin/shadow", headers=auth(STAGE_KEY)) as r:
                assert r.status == 200  # a rollout plan's shadow step
            for method, path in (("GET", "/admin/keys"), ("POST", "/admin/reload")):
                async with env.session.request(method, env.base + path, headers=auth(STAGE_KEY)) as r:
                    err = error_of(await r.read())
                    assert (r.status, err["code"]) == (403, "admin_key_required"), path
                    assert "the key 'controller' (scope stage) may not call this endpoint" in err["message"]
            status, _, raw = await env.post("/v1/chat/completions", chat(), headers=auth(STAGE_KEY))
            assert (status, error_of(raw)["code"]) == (403, "client_key_required")
            async with get(env.base + "/v1/models", headers=auth(STAGE_KEY)) as r:
                assert r.status == 403
            status, _, _ = await env.post("/v1/chat/completions", chat())  # the user key, for last_used
            async with get(env.base + "/admin/keys", headers=auth(ADMIN_KEY)) as r:
                doc = await r.json()
            by_name = {k["name"]: k for k in doc["keys"]}
            assert {n: k["scope"] for n, k in by_name.items()} == {
                "user": "client",
                "admin": "admin",
                "controller": "stage",
            }
            assert by_name["user"]["last_used"] > 0 and by_name["controller"]["last_used"] is None
            assert_no_key(json.dumps(doc))
            assert hash_key(USER_KEY) not in json.dumps(doc)

    run(scenario())
