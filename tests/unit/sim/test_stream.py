"""A request's Sink and vLLM's SSE framing: the byte strings the step loop writes are valid events."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from pdfleet.sim.stream import DEFAULT_FILLER, FILLER, Sink, chunk_frame, sse_event
from tests.unit.sim.helpers import chunk_events


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _token_event(sink: Sink, token: bytes, last: bool) -> dict[str, object]:
    raw = sink.prefix + token + (sink.last_suffix() if last else sink.mid)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return json.loads(raw[len(b"data: ") :])


def test_completion_token_events_are_vllm_text_completion_chunks(loop: asyncio.AbstractEventLoop) -> None:
    sink = Sink("completion", "cmpl-1", "llama", True, False, loop)
    mid = _token_event(sink, FILLER[0].encode(), last=False)
    assert mid["object"] == "text_completion" and mid["id"] == "cmpl-1" and mid["model"] == "llama"
    assert mid["choices"] == [
        {"index": 0, "text": " the", "logprobs": None, "finish_reason": None, "stop_reason": None}
    ]
    sink.finish_reason = "stop"
    assert _token_event(sink, FILLER[1].encode(), last=True)["choices"][0]["finish_reason"] == "stop"


def test_chat_token_events_and_the_role_event(loop: asyncio.AbstractEventLoop) -> None:
    sink = Sink("chat", "chatcmpl-1", "llama", True, True, loop)
    assert sink.chunk_object == "chat.completion.chunk"
    delta = _token_event(sink, FILLER[0].encode(), last=True)["choices"][0]
    assert delta["delta"] == {"content": " the"} and delta["finish_reason"] == "length"
    (role,) = chunk_events(chunk_frame(sink.role_event()))
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["created"] == sink.created


def test_frames_events_and_filler() -> None:
    assert chunk_frame(b"hello") == b"5\r\nhello\r\n"
    assert sse_event({"a": [1, None]}) == b'data: {"a":[1,null]}\n\n'
    assert DEFAULT_FILLER.text(3) == " the quick brown"
    assert DEFAULT_FILLER.text(len(FILLER) + 1).endswith(" real the")


def test_settle_wakes_the_handler_once_and_keeps_the_error(loop: asyncio.AbstractEventLoop) -> None:
    sink = Sink("completion", "cmpl-1", "llama", False, False, loop)
    sink.settle("KV transfer failed")
    sink.settle()  # a second settle (e.g. shutdown after a failure) is harmless
    assert sink.done.done() and sink.error == "KV transfer failed"
