"""/v1/messages through a real gateway to real simulators on loopback, with the Anthropic Python SDK as the
client: streaming and not, both key headers, Anthropic-shaped errors, and a disagg pool that does not
carry the route (kept colocated, counted)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdfleet.bench.launch import SimProcess
from pdfleet.gateway.anthropic import check_messages_fields
from pdfleet.gateway.app import Gateway, Running, start
from pdfleet.gateway.errors import Reject
from pdfleet.gateway.policy import load_policy
from pdfleet.metrics.scrape import scrape_metrics
from pdfleet.tokens import CharEstimate, count_chat_tokens, count_messages_tokens
from tests.unit.gateway.helpers import ADMIN_KEY, USER_KEY, LoopThread, policy_dict, write_policy
from tests.unit.sim.helpers import MODEL

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

LONG = "word " * 1200  # 1500 tokens at 4 chars/token: long at the test policy's threshold of 1000


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, SimProcess, SimProcess]]:
    """A gateway whose alias `llama` has a colocated simulator and a disagg one (standing in for the
    P/D router), stage long-all: long prompts go to disagg where the endpoint allows it."""
    common = [MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.05"]
    tmp = tmp_path_factory.mktemp("anthropic")
    loop = LoopThread()
    with SimProcess(common) as colo, SimProcess(common) as dis:
        pol = policy_dict([colo.url], dis.url, limits={"models": {"llama": {"max_prompt_tokens": 5000}}})
        path = write_policy(tmp, pol)

        async def up() -> Running:
            return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

        running: Running = loop.run(up)
        try:
            yield running, colo, dis
        finally:
            loop.run(running.close)
            loop.close()


def _client(running: Running, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("api_key", USER_KEY)
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{running.port}", max_retries=0, timeout=30, **kw)


def _gateway_metric(running: Running, name: str, **labels: str) -> float:
    body, _ = running.gateway.metrics.render()
    total = 0.0
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def test_sdk_non_streaming_with_x_api_key(fleet: tuple[Running, SimProcess, SimProcess]) -> None:
    running, _, _ = fleet
    raw = _client(running).messages.with_raw_response.create(
        model="llama", max_tokens=5, system="be brief", messages=[{"role": "user", "content": "hi"}]
    )
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant" and msg.stop_reason == "max_tokens"
    assert msg.content[0].type == "text" and msg.content[0].text == " the quick brown fox jumps"
    # the simulator counts what the gateway estimates: system + user message, 3 tokens each for roles
    assert msg.usage.output_tokens == 5
    assert msg.usage.input_tokens == count_messages_tokens(
        {"system": "be brief", "messages": [{"role": "user", "content": "hi"}]}, CharEstimate()
    )
    assert raw.headers["X-Pdfleet-Pool"] == "colocated"


def test_sdk_streams_with_bearer_auth_token(fleet: tuple[Running, SimProcess, SimProcess]) -> None:
    running, _, _ = fleet
    client = _client(running, api_key=None, auth_token=USER_KEY)
    with client.messages.stream(
        model="llama", max_tokens=6, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    ) as stream:
        kinds = [ev.type for ev in stream if ev.type != "text"]
        final = stream.get_final_message()
    assert kinds == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 6,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert final.content[0].text == " the quick brown fox jumps over"  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    assert final.usage.input_tokens == 5  # "user" + "hi": 1 + 1 + 3


def test_long_prompts_stay_colocated_when_the_disagg_pool_lacks_the_route(
    fleet: tuple[Running, SimProcess, SimProcess],
) -> None:
    running, colo, dis = fleet
    before = scrape_metrics(dis.url).get("vllm:request_success_total", 0.0)
    kept = _gateway_metric(running, "pdfleet_gateway_kept_colocated_total", endpoint="messages")
    raw = _client(running).messages.with_raw_response.create(
        model="llama", max_tokens=2, messages=[{"role": "user", "content": LONG}]
    )
    assert raw.headers["X-Pdfleet-Pool"] == "colocated"
    assert raw.parse().usage.input_tokens == 1504
    assert scrape_metrics(dis.url).get("vllm:request_success_total", 0.0) == before
    assert (
        _gateway_metric(
            running,
            "pdfleet_gateway_kept_colocated_total",
            endpoint="messages",
            reason="router_lacks_endpoint",
        )
        == kept + 1
    )
    assert (
        _gateway_metric(
            running,
            "pdfleet_gateway_routing_decisions_total",
            length_class="long",
            reason="endpoint_not_on_disagg",
        )
        >= 1
    )
    # the same long prompt on the chat route does go to disagg
    chat = {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": LONG}]}
    resp = _client(running).post(
        "/v1/chat/completions",
        cast_to=object,
        body=chat,
        options={"headers": {"Authorization": f"Bearer {USER_KEY}"}},
    )
    assert isinstance(resp, dict) and resp["usage"]["prompt_tokens"] == 1504
    assert scrape_metrics(dis.url).get("vllm:request_success_total", 0.0) == before + 1


def test_forcing_disagg_on_messages_is_a_clear_400(fleet: tuple[Running, SimProcess, SimProcess]) -> None:
    running, _, _ = fleet
    with pytest.raises(anthropic.BadRequestError) as exc:
        _client(running).messages.create(
            model="llama",
            max_tokens=2,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Pdfleet-Pool": "disagg"},
        )
    assert "does not carry the messages endpoint" in str(exc.value)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"api_key": "sk-wrong"}, "not valid for this gateway"),
        ({"api_key": None, "auth_token": "sk-wrong"}, "not valid for this gateway"),
    ],
)
def test_a_wrong_key_is_the_sdks_authentication_error(
    fleet: tuple[Running, SimProcess, SimProcess], kw: dict[str, Any], message: str
) -> None:
    running, _, _ = fleet
    with pytest.raises(anthropic.AuthenticationError) as exc:
        _client(running, **kw).messages.create(
            model="llama", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert exc.value.status_code == 401
    assert exc.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": exc.value.body["error"]["message"]},
    }  # type: ignore[index]
    assert message in str(exc.value) and "sk-wrong" not in str(exc.value)


def test_errors_have_anthropics_shape_and_status(fleet: tuple[Running, SimProcess, SimProcess]) -> None:
    running, _, _ = fleet
    client = _client(running)
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="gpt-4", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert "available models: llama" in str(nf.value)
    with pytest.raises(anthropic.BadRequestError, match="max_tokens: Field required"):
        client.post(
            "/v1/messages",
            cast_to=object,
            body={"model": "llama", "messages": [{"role": "user", "content": "x"}]},
        )
    with pytest.raises(anthropic.BadRequestError) as too_long:
        client.messages.create(
            model="llama", max_tokens=2, messages=[{"role": "user", "content": "w" * 24_000}]
        )
    text = str(too_long.value)
    assert "6004 tokens" in text and "limit for this model 'llama' is 5000" in text
    assert too_long.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


def test_upstream_unavailable_is_529_overloaded(tmp_path: Path) -> None:
    loop = LoopThread()
    path = write_policy(tmp_path, policy_dict(["http://127.0.0.1:9"], None))

    async def up() -> Running:
        return await start(Gateway(path, load_policy(path), shutdown_timeout=5))

    running: Running = loop.run(up)
    try:
        with pytest.raises(anthropic.APIStatusError) as exc:
            _client(running).messages.create(
                model="llama", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        assert exc.value.status_code == 529
        assert exc.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        assert _gateway_metric(running, "pdfleet_gateway_requests_total", status="529") == 1
    finally:
        loop.run(running.close)
        loop.close()


def test_admin_key_works_on_messages_too_and_the_key_never_leaks(
    fleet: tuple[Running, SimProcess, SimProcess],
) -> None:
    running, _, _ = fleet
    msg = _client(running, api_key=ADMIN_KEY).messages.create(
        model="llama", max_tokens=1, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.usage.output_tokens == 1
    body, _ = running.gateway.metrics.render()
    assert USER_KEY.encode() not in body and ADMIN_KEY.encode() not in body


# ---- pure: fields and the token estimate ---------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 1}, "messages: Field required"),
        ({"messages": [], "max_tokens": 1}, "non-empty list"),
        ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 1}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": []}], "max_tokens": 1}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": ["x"]}], "max_tokens": 1}, "every content block"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens: must be"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "system": 3}, "system: must be"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "stream": "y"}, "stream: must be"),
    ],
)
def test_bad_messages_bodies_are_400s(body: dict[str, Any], message: str) -> None:
    with pytest.raises(Reject) as exc:
        check_messages_fields(body)
    assert exc.value.status == 400 and message in exc.value.message
    assert json.loads(exc.value.response(style="anthropic").body)["type"] == "error"  # type: ignore[arg-type]


def test_the_estimate_counts_system_and_every_kind_of_content_block() -> None:
    counter = CharEstimate()
    body = {
        "system": [{"type": "text", "text": "a" * 40}, {"type": "text", "text": "b" * 40}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "c" * 40}, {"type": "image", "source": {}}],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": 1}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "d" * 40}]},
        ],
    }
    expected = count_chat_tokens(
        [
            {"role": "system", "content": "a" * 40 + "b" * 40},
            {"role": "user", "content": "c" * 40},
            {"role": "assistant", "content": '{"q": 1}'},
            {"role": "tool", "content": "d" * 40},
        ],
        counter,
    )
    assert (
        count_messages_tokens(body, counter)
        == expected
        == (3 + 2 + 20) + (3 + 1 + 10) + (3 + 3 + 2) + (3 + 1 + 10)
    )
