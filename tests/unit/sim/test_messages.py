"""The simulator's /v1/messages on the wire: vLLM's event framing and JSON shapes, its errors, and the
Anthropic SDK reading both the stream and the one-message answer."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.sim.messages import to_chat
from tests.unit.sim.helpers import MODEL

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with SimProcess([MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.05"]) as proc:
        yield proc


def _post(sim: SimProcess, body: Any) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        conn.request("POST", "/v1/messages", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), block
        out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_a_stream_is_vllms_event_sequence(sim: SimProcess) -> None:
    body = {
        "model": "llama",
        "max_tokens": 3,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    status, ctype, raw = _post(sim, body)
    assert status == 200 and ctype.startswith("text/event-stream")
    events = _events(raw)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(name == obj["type"] for name, obj in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"] == {"input_tokens": 5, "output_tokens": 0}
    assert events[1][1] == {
        "type": "content_block_start",
        "content_block": {"type": "text", "text": ""},
        "index": 0,
    }
    assert [e["delta"] for _, e in events[2:5]] == [
        {"type": "text_delta", "text": w} for w in (" the", " quick", " brown")
    ]
    assert events[6][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "max_tokens"},
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }


def test_one_message_answer_and_the_sdk_reads_both(sim: SimProcess) -> None:
    status, _, raw = _post(
        sim, {"model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    )
    msg = json.loads(raw)
    assert status == 200 and msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"] == [{"type": "text", "text": " the quick"}] and msg["stop_reason"] == "max_tokens"
    assert msg["usage"] == {"input_tokens": 5, "output_tokens": 2}
    client = anthropic.Anthropic(base_url=sim.url, api_key="unused", max_retries=0, timeout=30)
    with client.messages.stream(
        model="llama", max_tokens=4, system="sys", messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == " the quick brown fox" and final.usage.input_tokens == 11  # + system: 3 + 2 + 1


@pytest.mark.parametrize(
    ("body", "status", "err_type", "message"),
    [
        (
            {"model": "gpt-4", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
            404,
            "NotFoundError",
            "gpt-4",
        ),
        (
            {"model": "llama", "messages": [{"role": "user", "content": "x"}]},
            400,
            "BadRequestError",
            "max_tokens",
        ),
        ({"model": "llama", "max_tokens": 1, "messages": []}, 400, "BadRequestError", "at least one item"),
        (
            {"model": "llama", "max_tokens": 1, "messages": [{"role": "user", "content": []}]},
            400,
            "BadRequestError",
            "must not be empty",
        ),
        ([1, 2], 400, "BadRequestError", "JSON object"),
    ],
)
def test_errors_are_anthropic_shaped_with_vllms_types(
    sim: SimProcess, body: Any, status: int, err_type: str, message: str
) -> None:
    got, _, raw = _post(sim, body)
    err = json.loads(raw)
    assert got == status and err["type"] == "error" and err["error"]["type"] == err_type
    assert message in err["error"]["message"]


def test_the_chat_request_vllm_builds() -> None:
    body = {
        "model": "llama",
        "max_tokens": 7,
        "stream": True,
        "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}
        ],
    }
    assert json.loads(to_chat(json.dumps(body).encode())) == {
        "messages": [
            {"role": "system", "content": "ab"},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        ],
        "max_tokens": 7,
        "model": "llama",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
