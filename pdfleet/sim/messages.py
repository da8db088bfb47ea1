"""The simulator's `POST /v1/messages`: the Anthropic Messages API as vLLM serves it
(vllm/entrypoints/anthropic/: api_router.py, serving.py).

vLLM turns a Messages request into a chat completion request (`system` first, text blocks as content,
max_tokens as max_tokens), runs it, and converts the result: one JSON message, or the SSE events
message_start, content_block_start, content_block_delta (one per token), content_block_stop,
message_delta (stop_reason, usage), message_stop, each framed `event: NAME\\ndata: {json}`. Its errors
are `{"type": "error", "error": {"type", "message"}}` with vLLM's status. Here the request goes through
the same intake and engine as a chat request; the step loop writes each delta event (`MessagesSink`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

from aiohttp import web

from pdfleet.sim.engine import SimRequest
from pdfleet.sim.intake import Intake, RequestError, json_response, parse_json, take_arrival
from pdfleet.sim.runtime import Pending, Runtime
from pdfleet.sim.stream import Sink, chunk_frame, compact
from pdfleet.tokens import messages_as_chat

# vLLM's stop_reason_map
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def event(name: str, obj: Any) -> bytes:
    """One Anthropic SSE event, as vLLM's wrap_data_with_event frames it."""
    return b"event: " + name.encode() + b"\ndata: " + compact(obj).encode() + b"\n\n"


def anthropic_error_response(message: str, err_type: str, status: int) -> web.Response:
    """vLLM's AnthropicErrorResponse with its status."""
    return json_response({"type": "error", "error": {"type": err_type, "message": message}}, status=status)


def translate(exc: RequestError) -> web.Response:
    """A chat-route RequestError in the Anthropic error shape (vLLM's translate_error_response)."""
    resp = exc.response
    assert isinstance(resp.body, bytes)
    err = json.loads(resp.body)["error"]
    return anthropic_error_response(err["message"], err["type"], resp.status)


def to_chat(raw: bytes) -> bytes:
    """The chat completion request body vLLM builds from a Messages body (RequestError when invalid)."""
    body = parse_json(raw)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("messages must contain at least one item", param="messages")
    if any(isinstance(m, dict) and isinstance(m.get("content"), list) and not m["content"] for m in msgs):
        raise RequestError("message content must not be empty", param="messages")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise RequestError("max_tokens: Field required (an integer)", param="max_tokens")
    chat: dict[str, Any] = {"messages": messages_as_chat(body), "max_tokens": max_tokens}
    if "model" in body:
        chat["model"] = body["model"]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return json.dumps(chat).encode()


class MessagesSink(Sink):
    """A Sink whose stream is Anthropic events: the step loop writes one content_block_delta per token."""

    __slots__ = ("input_tokens",)

    def __init__(
        self, rid: str, model: str, stream: bool, input_tokens: int, loop: asyncio.AbstractEventLoop
    ) -> None:
        super().__init__("chat", rid, model, stream, True, loop)  # "chat": the opening event comes first
        self.input_tokens = input_tokens
        self.prefix = (
            b'event: content_block_delta\ndata: {"type":"content_block_delta",'
            b'"delta":{"type":"text_delta","text":"'
        )
        self.mid = b'"},"index":0}\n\n'

    def role_event(self) -> bytes:
        """message_start and content_block_start, sent with the first token."""
        usage = {"input_tokens": self.input_tokens, "output_tokens": 0}
        message: dict[str, Any] = {
            "id": self.rid,
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        start = event("message_start", {"type": "message_start", "message": message})
        block = {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
        return start + event("content_block_start", block)

    def last_suffix(self) -> bytes:
        """The last token's delta ends like every other; the stop reason comes in message_delta."""
        return self.mid

    def tail(self, output_tokens: int) -> bytes:
        """content_block_stop, message_delta (stop reason, usage), message_stop."""
        usage = {"input_tokens": self.input_tokens, "output_tokens": output_tokens}
        delta = {"stop_reason": STOP_REASONS.get(self.finish_reason, "end_turn")}
        return (
            event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
            + event("message_stop", {"type": "message_stop"})
        )


async def handle(runtime: Runtime, intake: Intake, request: web.Request) -> web.StreamResponse:
    """Run one Messages request through the engine; stream its events or answer with one message."""
    arrival = runtime.clock.at_wall(take_arrival(request, asyncio.get_running_loop().time()))
    with runtime.arriving(arrival) as pending:  # later steps wait for it: its intake is not GPU time
        return await _admitted(runtime, intake, request, arrival, pending)


async def _admitted(
    runtime: Runtime, intake: Intake, request: web.Request, arrival: float, pending: Pending
) -> web.StreamResponse:
    """Read and translate the request, hand it to the engine at `arrival`, answer it."""
    loop = asyncio.get_running_loop()
    try:
        prepared = await intake.prepare(to_chat(await request.read()), "chat")
    except RequestError as exc:
        return translate(exc)
    model, prompt_tokens, max_tokens, finish, stream, _usage = prepared.parsed
    rid = f"chatcmpl-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"
    sink = MessagesSink(rid, model, stream, prompt_tokens, loop)
    sink.finish_reason = finish
    req = SimRequest(f"{rid}-msg", prompt_tokens, max_tokens, sink=sink, block_hashes=prepared.hashes)
    runtime.metrics.max_tokens_hist.observe(max_tokens)
    resp: web.StreamResponse | None = None
    if stream:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        request.writer.send_headers()
        sink.transport = request.transport
    runtime.submit(req, arrival)
    pending.done()
    try:
        await sink.done
    except asyncio.CancelledError:
        runtime.abort(req)  # the client went away: vLLM aborts the request
        raise
    if (sink.error or req.finish_reason == "abort") and resp is None:
        return anthropic_error_response(sink.error or "Request aborted", "internal_error", 500)
    if resp is not None:
        return await _stream_tail(resp, req, sink)
    text = runtime.filler.text(req.generated)
    return json_response(
        {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "model": model,
            "stop_reason": STOP_REASONS.get(sink.finish_reason, "end_turn"),
            "usage": {"input_tokens": prompt_tokens, "output_tokens": req.generated},
        }
    )


async def _stream_tail(resp: web.StreamResponse, req: SimRequest, sink: MessagesSink) -> web.StreamResponse:
    """After the last token: the closing events (or an error event), then the end of the body."""
    transport = sink.transport
    if transport is None or transport.is_closing():
        return resp
    if sink.error:
        tail = event("error", {"type": "error", "error": {"type": "internal_error", "message": sink.error}})
    else:
        tail = sink.tail(req.generated)
    with contextlib.suppress(ConnectionError, RuntimeError):
        transport.write(chunk_frame(tail))
        await resp.write_eof()
    return resp
