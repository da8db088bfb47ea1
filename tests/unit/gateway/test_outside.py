"""Outside endpoints: a real gateway on loopback in front of a self-hosted alias and two "hosted providers"
(simulators: one guarded by --api-key as an OpenAI-compatible API, one behind a loopback front that checks
Anthropic's x-api-key), with the OpenAI and Anthropic SDKs as clients. One base URL and one key reach
every alias; the provider gets its own key in its API's header, never the client's; the key shows up in no
answer, log line, metric or /admin output; the wrong API is refused with 400; a refused key is a 502."""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web

from pdfleet.bench.launch import SimProcess
from pdfleet.errors import ValidationError
from pdfleet.gateway.app import Gateway, Running, start
from pdfleet.gateway.outside import Outside, check_api, outside_headers, read_outside_key
from pdfleet.gateway.policy import load_policy
from tests.unit.gateway.helpers import (
    ADMIN_KEY,
    USER_KEY,
    LogCapture,
    LoopThread,
    policy_dict,
    policy_error,
    write_policy,
)
from tests.unit.sim.helpers import MODEL

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

OPENAI_KEY = "sk-hosted-openai-5f1e2d3c4b5a6978"
ANTHROPIC_KEY = "sk-ant-hosted-0a1b2c3d4e5f6789"
WRONG_KEY = "sk-hosted-wrong-1111222233334444"
SECRETS = (OPENAI_KEY, ANTHROPIC_KEY, WRONG_KEY, USER_KEY, ADMIN_KEY)


def _key_file(path: Path, key: str, mode: int = 0o600) -> str:
    path.write_text(key + "\n")
    os.chmod(path, mode)
    return str(path)


def _no_secret(*texts: str | bytes) -> None:
    for text in texts:
        raw = text if isinstance(text, bytes) else text.encode()
        for key in SECRETS:
            assert key.encode() not in raw, f"a key leaked: {raw[:300]!r}"


# ---- the key file and the pure rules ------------------------------------------------------------


def test_a_key_file_others_can_read_is_refused_with_file_and_reason(tmp_path: Path) -> None:
    path = Path(_key_file(tmp_path / "hosted.key", OPENAI_KEY, 0o644))
    with pytest.raises(ValidationError) as exc:
        read_outside_key(path, "policy.yaml: models.gpt.outside.key_file")
    msg = str(exc.value)
    assert "models.gpt.outside.key_file" in msg and str(path) in msg and "chmod 600" in msg
    _no_secret(msg)
    os.chmod(path, 0o600)
    assert read_outside_key(path, "x") == OPENAI_KEY  # the line ending is not part of the key


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("", "empty"),
        ("\n  \n", "empty"),
        (f"{OPENAI_KEY}\n{ANTHROPIC_KEY}\n", "one key on one line"),
        (f"Bearer {OPENAI_KEY}", "one key on one line"),
    ],
)
def test_a_key_file_must_hold_one_key(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "k"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(ValidationError) as exc:
        read_outside_key(path, "where")
    assert fragment in str(exc.value)
    _no_secret(str(exc.value))


def test_each_api_is_called_on_its_own_endpoints_and_gets_its_own_header() -> None:
    oa = Outside("openai", "https://api.example.com", "k", OPENAI_KEY)
    an = Outside("anthropic", "http://10.0.0.1:9000/prefix", "k", ANTHROPIC_KEY)
    assert check_api("gpt", oa, "chat") is None and check_api("gpt", oa, "completions") is None
    assert check_api("claude", an, "messages") is None and check_api("llama", None, "messages") is None
    msg = check_api("claude", an, "chat")
    assert msg is not None and "'claude'" in msg and "Anthropic" in msg and "/v1/messages" in msg
    client = {"Authorization": f"Bearer {USER_KEY}", "x-api-key": USER_KEY, "anthropic-beta": "b1"}
    assert outside_headers(oa, client) == {
        "Content-Type": "application/json",
        "Accept": "*/*",
        "Authorization": f"Bearer {OPENAI_KEY}",
    }
    sent = outside_headers(an, client)
    assert sent["x-api-key"] == ANTHROPIC_KEY and "Authorization" not in sent
    assert (sent["anthropic-version"], sent["anthropic-beta"]) == ("2023-06-01", "b1")
    assert an.path("messages") == "/prefix/v1/messages" and oa.path("chat") == "/v1/chat/completions"
    assert OPENAI_KEY not in repr(oa)


@pytest.mark.parametrize(
    ("route", "fragment"),
    [
        (
            {"outside": {"api": "openai", "base_url": "https://api.example.com/v1", "key_file": "k"}},
            "models.gpt.outside.base_url: ",
        ),
        (
            {"outside": {"api": "gemini", "base_url": "https://api.example.com", "key_file": "k"}},
            "models.gpt.outside.api",
        ),
        (
            {
                "outside": {"api": "openai", "base_url": "https://api.example.com", "key_file": "k"},
                "disagg": "http://127.0.0.1:9",
            },
            "models.gpt.disagg: an outside alias has no pools",
        ),
        (
            {"outside": {"api": "openai", "base_url": "https://api.example.com", "key_file": "absent.key"}},
            "models.gpt.outside.key_file",
        ),
    ],
)
def test_bad_outside_aliases_are_refused_naming_the_key(
    tmp_path: Path, route: dict[str, Any], fragment: str
) -> None:
    pol = policy_dict(["http://127.0.0.1:8001"], None)
    pol["models"]["gpt"] = route
    assert fragment in policy_error(tmp_path, pol)


# ---- a real gateway, real SDKs, simulators as the hosted providers ---------------------------------


class AnthropicFront:
    """A hosted Anthropic-compatible API on loopback: checks x-api-key, records the headers it got, and
    relays the body to a simulator's /v1/messages, streaming."""

    def __init__(self, sim_url: str) -> None:
        self.sim_url = sim_url
        self.seen: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/messages", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(dict(request.headers))
        if request.headers.get("x-api-key") != ANTHROPIC_KEY:
            err = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
            return web.json_response(err, status=401)
        body = await request.read()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                self.sim_url + "/v1/messages", data=body, headers={"Content-Type": "application/json"}
            ) as up,
        ):
            out = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers["Content-Type"]})
            await out.prepare(request)
            async for chunk in up.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, AnthropicFront]]:
    """A gateway with `llama` (a colocated simulator), `gpt` (an OpenAI-compatible simulator that takes
    only OPENAI_KEY), `gpt-wrong-key` (the same provider, the wrong key), `claude` (the Anthropic front)."""
    tmp = tmp_path_factory.mktemp("outside")
    common = [MODEL, "--sim-time-scale", "0.05"]
    loop = LoopThread()
    with (
        SimProcess([*common, "--served-model-name", "llama"]) as colo,
        SimProcess([*common, "--served-model-name", "hosted-gpt", "--api-key", OPENAI_KEY]) as hosted,
        SimProcess([*common, "--served-model-name", "hosted-claude"]) as behind,
    ):
        front = AnthropicFront(behind.url)
        loop.run(front.start)
        pol = policy_dict([colo.url], None)
        openai_outside = {
            "api": "openai",
            "base_url": hosted.url,
            "key_file": _key_file(tmp / "oa.key", OPENAI_KEY),
        }
        pol["models"].update(
            {
                "gpt": {"outside": openai_outside, "upstream_model": "hosted-gpt"},
                "gpt-wrong-key": {
                    "outside": {**openai_outside, "key_file": _key_file(tmp / "wrong.key", WRONG_KEY)},
                    "upstream_model": "hosted-gpt",
                },
                "claude": {
                    "outside": {"api": "anthropic", "base_url": front.url, "key_file": "an.key"},
                    "upstream_model": "hosted-claude",
                },
            }
        )
        _key_file(tmp / "an.key", ANTHROPIC_KEY)  # relative: beside the policy file
        path = write_policy(tmp, pol)

        async def up() -> Running:
            return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

        running: Running = loop.run(up)
        try:
            yield running, front
        finally:
            loop.run(running.close)
            loop.run(front.stop)
            loop.close()


def _openai(running: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{running.port}/v1", api_key=USER_KEY, max_retries=0)


def _anthropic(running: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{running.port}", api_key=USER_KEY, max_retries=0)


def test_one_key_reaches_the_self_hosted_and_the_outside_alias_by_changing_model(
    fleet: tuple[Running, AnthropicFront],
) -> None:
    running, _ = fleet
    client = _openai(running)
    for model, pool in (("llama", "colocated"), ("gpt", "outside")):
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        assert raw.headers["X-Pdfleet-Pool"] == pool
        chunks = list(raw.parse())
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text.split() == ["the", "quick", "brown", "fox"]
        assert {c.model for c in chunks} == {"hosted-gpt" if model == "gpt" else "llama"}
    done = client.completions.create(model="gpt", prompt="hi", max_tokens=2)
    assert done.model == "hosted-gpt" and done.choices[0].text.split() == ["the", "quick"]


def test_the_anthropic_sdk_streams_from_the_outside_anthropic_alias_with_its_own_key(
    fleet: tuple[Running, AnthropicFront],
) -> None:
    running, front = fleet
    before = len(front.seen)
    with _anthropic(running).messages.stream(
        model="claude", max_tokens=3, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        kinds = [ev.type for ev in stream if ev.type != "text"]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.model == "hosted-claude" and final.usage.output_tokens == 3
    sent = front.seen[before]
    assert sent["x-api-key"] == ANTHROPIC_KEY and sent["anthropic-version"]
    assert "Authorization" not in sent and USER_KEY not in str(sent)  # the client's key stays here


def test_the_wrong_api_is_refused_naming_the_alias_and_the_api(fleet: tuple[Running, AnthropicFront]) -> None:
    running, front = fleet
    seen = len(front.seen)
    with pytest.raises(openai.BadRequestError) as oa:
        _openai(running).chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}])
    assert "'claude'" in str(oa.value) and "/v1/messages" in str(oa.value)
    with pytest.raises(anthropic.BadRequestError) as an:
        _anthropic(running).messages.create(
            model="gpt", max_tokens=2, messages=[{"role": "user", "content": "x"}]
        )
    assert "'gpt'" in str(an.value) and "OpenAI" in str(an.value)
    forced = _openai(running).chat.completions.with_raw_response
    with pytest.raises(openai.BadRequestError) as hdr:
        forced.create(
            model="gpt",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Pdfleet-Pool": "colocated"},
        )
    assert "outside endpoint" in str(hdr.value)
    assert len(front.seen) == seen  # nothing reached a provider


def test_a_refused_outside_key_is_a_502_that_quotes_nothing_of_the_provider(
    fleet: tuple[Running, AnthropicFront],
) -> None:
    running, _ = fleet
    with LogCapture() as logs, pytest.raises(openai.APIStatusError) as exc:
        _openai(running).chat.completions.create(
            model="gpt-wrong-key", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert exc.value.status_code == 502
    body = exc.value.response.text
    assert "outside_key_refused" in body and "'gpt-wrong-key'" in body and "Unauthorized" not in body
    _no_secret(body, logs.text)


def test_no_key_reaches_admin_output_metrics_or_logs(fleet: tuple[Running, AnthropicFront]) -> None:
    running, _ = fleet
    with LogCapture() as logs:
        _openai(running).chat.completions.create(
            model="gpt", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    req = urllib.request.Request(
        f"http://127.0.0.1:{running.port}/admin/policy", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        admin = json.loads(resp.read())
    assert admin["models"]["gpt"]["outside"] == {
        "api": "openai",
        "base_url": admin["models"]["gpt"]["outside"]["base_url"],
        "key_file": admin["models"]["gpt"]["outside"]["key_file"],
    }
    assert admin["models"]["claude"]["outside"]["key_file"] == "an.key"
    metrics, _ = running.gateway.metrics.render()
    assert (
        b'pdfleet_gateway_requests_total{length_class="short",model="gpt",pool="outside",status="200"}'
        in metrics
    )
    assert b'reason="outside"' in metrics
    _no_secret(str(admin), metrics, logs.text)
