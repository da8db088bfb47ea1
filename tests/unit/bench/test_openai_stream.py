"""The bench client against a scripted server: chunked SSE split anywhere, usage, role-only and empty events,
HTTP errors, a stream cut mid-way, a refused connection, and kept-alive connections reused."""

from __future__ import annotations

import asyncio
import json

import pytest

from pdfleet.bench.openai_stream import Record, StreamingClient, completion_body, completion_request
from pdfleet.bench.procs import free_port
from tests.unit.bench.helpers import DONE, SSE_HEAD, TERMINATOR, Reply, ScriptedServer, chunk


def text_event(text: str) -> bytes:
    return chunk(b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n")


USAGE = chunk(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n')


def run(respond, n: int = 1) -> tuple[list[Record], ScriptedServer, StreamingClient]:  # noqa: ANN001
    async def main() -> tuple[list[Record], ScriptedServer, StreamingClient]:
        async with ScriptedServer(respond) as server:
            client = StreamingClient("127.0.0.1", server.port)
            recs = []
            for i in range(n):
                r = Record(i, "colocated", "short", 5, 3)
                body = completion_body("m", "hello", 3)
                await client.run(completion_request("127.0.0.1", server.port, "sk-x", "disagg", body), r)
                recs.append(r)
            client.close()
            return recs, server, client

    return asyncio.run(main())


def test_ttft_at_the_first_content_event_and_usage_gives_n() -> None:
    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD)
        await reply.write(
            chunk(b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n')
        )
        await asyncio.sleep(0.05)
        for t in ("a", "b", "c"):
            await reply.write(text_event(t))
            await asyncio.sleep(0.01)
        await reply.write(USAGE + DONE)
        return True

    [r], server, _ = run(respond)
    assert r.success and r.output_tokens == 3 and len(r.chunks) == 3
    assert r.ttft >= 0.05  # the role-only event does not count
    assert r.chunks[0] == pytest.approx(r.start + r.ttft)
    head = server.requests[0]
    assert b"X-Pdfleet-Pool: disagg" in head and b"Authorization: Bearer sk-x" in head
    body = json.loads(head.split(b"\r\n\r\n", 1)[1])
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and body["ignore_eos"]


def test_events_split_across_reads_and_chunks_are_parsed_once() -> None:
    """A chunk boundary inside an event, and an event split over two TCP writes."""
    event = b'data: {"choices":[{"index":0,"text":"xy"}]}\n\n'

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD)
        payload = event + event
        await reply.write(chunk(payload[:17]))
        await asyncio.sleep(0.01)
        await reply.write(chunk(payload[17:60])[:5])
        await asyncio.sleep(0.01)
        await reply.write(chunk(payload[17:60])[5:] + chunk(payload[60:]))
        await reply.write(DONE)
        return True

    [r], _, _ = run(respond)
    assert r.success and len(r.chunks) == 2 and r.output_tokens is None


def test_http_error_is_a_failed_record_with_the_servers_message() -> None:
    async def respond(reply: Reply) -> bool:
        body = b'{"error":{"message":"disaggregated pool unavailable","type":"x"}}'
        await reply.write(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        return True

    [r], _, _ = run(respond)
    assert not r.success and r.status == 502
    assert r.error == "HTTP 502: disaggregated pool unavailable"


def test_a_stream_cut_mid_way_is_failed_not_dropped() -> None:
    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + text_event("a") + text_event("b"))
        return False  # hang up without [DONE]

    [r], _, _ = run(respond)
    assert not r.success and len(r.chunks) == 2
    assert "closed mid-stream after 2 token event(s)" in r.error


def test_a_body_that_ends_without_done_is_failed() -> None:
    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + text_event("a") + TERMINATOR)
        return True

    [r], _, _ = run(respond)
    assert "ended before data: [DONE]" in r.error


def test_kept_alive_connection_is_reused() -> None:
    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + text_event("a") + USAGE + DONE)
        return True

    recs, server, _ = run(respond, n=3)
    assert all(r.success for r in recs)
    assert [rep.index for rep in server.replies] == [0, 1, 2]  # one connection, three requests


def test_a_refused_connection_is_a_failed_record() -> None:
    port = free_port()
    r = Record(0, "colocated", "short", 1, 1)
    asyncio.run(
        StreamingClient("127.0.0.1", port).run(completion_request("127.0.0.1", port, None, None, {}), r)
    )
    assert not r.success and r.error.startswith(f"cannot connect to 127.0.0.1:{port}")


def test_extra_headers_follow_the_pool_and_a_line_break_in_one_is_refused() -> None:
    head = completion_request("h", 1, None, "disagg", {}, {"X-Session-Id": "s-1"}).split(b"\r\n\r\n")[0]
    assert head.split(b"\r\n")[-2:] == [b"X-Pdfleet-Pool: disagg", b"X-Session-Id: s-1"]
    for bad in ({"X-Session-Id": "a\r\nX-Pdfleet-Pool: colocated"}, {"X-A:": "b"}, {"": "b"}):
        with pytest.raises(ValueError, match="not one header line"):
            completion_request("h", 1, None, None, {}, bad)
