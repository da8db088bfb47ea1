"""The streaming client against a scripted loopback server: TTFT, every event's time, chunked SSE split
anywhere, usage, role-only events, HTTP errors, a stream cut mid-way, a refused connection, kept-alive
connections reused or retried when stale, in both modes (payloads read or only counted)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from pdfleet.bench.client import Record, Stats, StreamClient, request_bytes
from pdfleet.bench.procs import free_port
from pdfleet.bench.stats import itl
from pdfleet.bench.workloads import completion_body
from tests.unit.bench.helpers import DONE, SSE_HEAD, TERMINATOR, Reply, ScriptedServer, chunk, event

PATH = "/v1/chat/completions"


def _client(port: int, keepalive: bool = True, parse: bool = False) -> tuple[StreamClient, bytes]:
    """A client reading no payload (as the simulator and gateway benches use it) and its request."""
    request = request_bytes("127.0.0.1", port, PATH, b"{}", keepalive=keepalive)
    return StreamClient("127.0.0.1", port, keepalive=keepalive, parse=parse), request


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> float:
    """Wait (yielding to the loop) until check() holds; when it was seen to hold."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "the client never got there"
        await asyncio.sleep(0.001)
    return time.perf_counter()


def _stream_once(respond: Callable[..., Any], rec: Record) -> tuple[Stats, list[float]]:
    """One recorded stream against a scripted server: the client's stats and the server's write stamps."""

    async def main() -> tuple[Stats, list[float]]:
        async with ScriptedServer(respond) as server:
            client, request = _client(server.port)
            await client.run(request, rec)
            client.close()
            return client.stats, server.replies[0].stamps

    return asyncio.run(main())


def test_ttft_and_every_event_time_lie_between_the_write_and_the_clients_receipt() -> None:
    """Each event's time is after the server wrote it and before the server saw it recorded."""
    rec = Record()
    seen: list[float] = []
    delays = [0.05, 0.03, 0.08]

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD)
        for i, delay in enumerate(delays):
            await asyncio.sleep(delay)
            await reply.write(event(f"t{i}"))
            seen.append(await _until(lambda i=i: len(rec.chunks) > i))
        await reply.write(DONE)
        return True

    stats, stamps = _stream_once(respond, rec)
    written = stamps[1:4]  # the head first, [DONE] last
    assert len(rec.chunks) == 3  # [DONE] is no event
    assert all(w <= t <= s for w, t, s in zip(written, rec.chunks, seen, strict=True))
    assert stats.ttft == [rec.chunks[0] - rec.start]
    assert stats.ttft[0] >= delays[0]
    # each gap is at least the server's pause between the client's receipt and the next write
    assert all(g >= d for g, d in zip(itl(rec.chunks), delays[1:], strict=True))
    assert rec.start <= rec.chunks[0] <= rec.chunks[-1] <= rec.end
    assert (stats.done, stats.failed, stats.events, stats.connects) == (1, 0, 4, 1)


def test_events_read_together_share_one_time_and_a_split_event_counts_once() -> None:
    """Two events in one write get one time (a zero gap); an event split over writes is one event."""
    rec = Record()
    two = event("a") + event("b")
    split = event("c")

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + two)
        await _until(lambda: len(rec.chunks) == 2)
        await reply.write(split[:20])
        await asyncio.sleep(0.02)
        await reply.write(split[20:])
        cut = DONE.index(b"NE]")
        await reply.write(DONE[:cut])  # [DONE] split over two reads: still no event, still the end
        await asyncio.sleep(0.02)
        await reply.write(DONE[cut:])
        return True

    stats, stamps = _stream_once(respond, rec)
    assert len(rec.chunks) == 3
    assert rec.chunks[0] == rec.chunks[1]
    assert rec.chunks[2] >= stamps[2]  # when the second half of the split event was written
    assert (stats.done, stats.failed, stats.events) == (1, 0, 4)


def test_kept_alive_streams_share_one_connection_and_close_opens_one_each() -> None:
    """keepalive: the pool reuses the idle connection; close: `Connection: close`, a connection per stream."""

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + event("x") + DONE)
        return True

    async def run(keepalive: bool) -> tuple[Stats, list[bytes]]:
        async with ScriptedServer(respond) as server:
            client, request = _client(server.port, keepalive)
            for _ in range(3):
                await client.run(request, Record())
            client.close()
            return client.stats, server.requests

    stats, requests = asyncio.run(run(True))
    assert (stats.done, stats.connects) == (3, 1)
    assert all(b"Connection: close" not in r for r in requests)
    stats, requests = asyncio.run(run(False))
    assert (stats.done, stats.connects) == (3, 3)
    assert all(b"Connection: close" in r for r in requests)


def test_a_kept_alive_connection_the_server_dropped_is_retried_as_stale() -> None:
    """The server closes a reused connection without a byte: the stream is retried on a new one."""

    async def respond(reply: Reply) -> bool:
        if reply.index == 1:
            return False  # the second request on a connection: hang up unanswered
        await reply.write(SSE_HEAD + event("x") + DONE)
        return True

    async def main() -> tuple[Stats, Record]:
        async with ScriptedServer(respond) as server:
            client, request = _client(server.port)
            await client.run(request, Record())
            rec = Record()
            await client.run(request, rec)
            client.close()
            return client.stats, rec

    stats, rec = asyncio.run(main())
    assert (stats.done, stats.failed, stats.stale, stats.connects) == (2, 0, 1, 2)
    assert len(rec.chunks) == 1 and not rec.error


def test_an_error_reply_fails_and_its_connection_is_not_reused() -> None:
    """A 503 with a body is a failed stream; the next stream opens a new connection."""

    async def respond(reply: Reply) -> bool:
        if reply.number == 0:
            await reply.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
        else:
            await reply.write(SSE_HEAD + event("x") + DONE)
        return True

    async def main() -> tuple[Stats, Record]:
        async with ScriptedServer(respond) as server:
            client, request = _client(server.port)
            rec = Record()
            await client.run(request, rec)
            await client.run(request, Record())
            client.close()
            return client.stats, rec

    stats, rec = asyncio.run(main())
    assert (stats.failed, stats.done, stats.connects) == (1, 1, 2)
    assert len(stats.ttft) == 1  # the failed stream had no event, so no TTFT
    assert rec.end >= rec.start


def test_a_refused_connection_is_a_failed_stream() -> None:
    """Nothing listening: the stream fails (and ends) instead of raising."""

    async def main() -> tuple[Stats, Record]:
        client, request = _client(free_port())
        rec = Record()
        await client.run(request, rec)
        return client.stats, rec

    stats, rec = asyncio.run(main())
    assert (stats.failed, stats.done, stats.connects) == (1, 0, 0)
    assert rec.end >= rec.start


def test_streams_not_asked_to_record_add_no_ttft_to_the_stats() -> None:
    """record=False: counted, and the record has its times, but the stats' TTFT list leaves it out."""

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + event("x") + event("y") + DONE)
        return True

    async def main() -> tuple[Stats, Record]:
        async with ScriptedServer(respond) as server:
            client, request = _client(server.port)
            rec = Record()
            await client.run(request, rec, record=False)
            client.close()
            return client.stats, rec

    stats, rec = asyncio.run(main())
    assert (stats.ttft, stats.done, stats.events, len(rec.chunks)) == ([], 1, 3, 2)
    assert rec.ttft == rec.chunks[0] - rec.start


def test_request_bytes_frame_one_post() -> None:
    """Host, key, content type and length; `Connection: close` only when not kept alive."""
    raw = request_bytes("10.0.0.1", 8000, PATH, b'{"a":1}', key="sk-1", keepalive=False)
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == f"POST {PATH} HTTP/1.1"
    assert {
        "Host: 10.0.0.1:8000",
        "Authorization: Bearer sk-1",
        "Connection: close",
        "Content-Length: 7",
    } <= set(lines)
    assert body == b'{"a":1}'
    kept = request_bytes("127.0.0.1", 8000, PATH, {}).decode()
    assert "Connection" not in kept and "Authorization" not in kept and "Host: 127.0.0.1:8000" in kept


def text_event(text: str) -> bytes:
    return chunk(b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n")


USAGE = chunk(b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n')


def run(respond: Callable[[Reply], Any], n: int = 1) -> tuple[list[Record], ScriptedServer, StreamClient]:
    """`n` parsed requests through a scripted server, one after another on one client."""

    async def main() -> tuple[list[Record], ScriptedServer, StreamClient]:
        async with ScriptedServer(respond) as server:
            client = StreamClient("127.0.0.1", server.port)
            recs = []
            for i in range(n):
                r = Record(i, "colocated", "short", 5, 3)
                body = completion_body("hello", 3, "m", usage=True)
                request = request_bytes(
                    "127.0.0.1", server.port, "/v1/completions", body, key="sk-x", pool="disagg"
                )
                await client.run(request, r)
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
    one = b'data: {"choices":[{"index":0,"text":"xy"}]}\n\n'

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD)
        payload = one + one
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
        StreamClient("127.0.0.1", port).run(request_bytes("127.0.0.1", port, "/v1/completions", {}), r)
    )
    assert not r.success and r.error.startswith(f"cannot connect to 127.0.0.1:{port}")


def test_extra_headers_follow_the_pool_and_a_line_break_in_one_is_refused() -> None:
    head = request_bytes("h", 1, "/", {}, pool="disagg", headers={"X-Session-Id": "s-1"}).split(b"\r\n\r\n")[
        0
    ]
    assert head.split(b"\r\n")[-2:] == [b"X-Pdfleet-Pool: disagg", b"X-Session-Id: s-1"]
    for bad in ({"X-Session-Id": "a\r\nX-Pdfleet-Pool: colocated"}, {"X-A:": "b"}, {"": "b"}):
        with pytest.raises(ValueError, match="not one header line"):
            request_bytes("h", 1, "/", {}, headers=bad)


@pytest.mark.parametrize(("parse", "chunks", "usage"), [(True, 1, 3), (False, 3, None)])
def test_parse_reads_content_and_usage_and_counting_takes_every_data_event(
    parse: bool, chunks: int, usage: int | None
) -> None:
    """parse=True: the role-only event and the usage event are no content; parse=False reads no payload:
    each of the three `data:` events but [DONE] is a chunk, and no usage is known."""

    async def respond(reply: Reply) -> bool:
        role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        await reply.write(SSE_HEAD + chunk(role) + event("a") + USAGE + DONE)
        return True

    async def main() -> tuple[Stats, Record]:
        async with ScriptedServer(respond) as server:
            client, request = _client(server.port, parse=parse)
            rec = Record()
            await client.run(request, rec)
            client.close()
            return client.stats, rec

    stats, rec = asyncio.run(main())
    assert (len(rec.chunks), rec.output_tokens, rec.error) == (chunks, usage, "")
    assert (stats.done, stats.events) == (1, 4)


def test_the_gateways_instance_header_is_recorded_and_its_absence_or_garbage_leaves_none() -> None:
    def head(extra: bytes) -> bytes:
        return SSE_HEAD.replace(b"\r\n\r\n", b"\r\n" + extra + b"\r\n\r\n") if extra else SSE_HEAD

    for extra, want in ((b"X-Pdfleet-Instance: 3", 3), (b"x-pdfleet-instance:  0 ", 0), (b"", None)):

        async def respond(reply: Reply, h: bytes = head(extra)) -> bool:
            await reply.write(h + text_event("a") + USAGE + DONE)
            return True

        [r], _, _ = run(respond)
        assert r.success and r.instance == want

    async def garbage(reply: Reply) -> bool:
        await reply.write(head(b"X-Pdfleet-Instance: ten") + text_event("a") + DONE)
        return True

    [r], _, _ = run(garbage)
    assert r.success and r.instance is None


def test_the_gateways_pool_and_decision_headers_are_recorded_and_their_absence_leaves_them_empty() -> None:
    def head(extra: bytes) -> bytes:
        return SSE_HEAD.replace(b"\r\n\r\n", b"\r\n" + extra + b"\r\n\r\n") if extra else SSE_HEAD

    cases = (
        (b"X-Pdfleet-Pool: disagg\r\nX-Pdfleet-Decision: stage_weight", ("disagg", "stage_weight")),
        (b"x-pdfleet-pool:  colocated \r\nx-pdfleet-decision: short", ("colocated", "short")),
        (b"", ("", "")),
    )
    for extra, want in cases:

        async def respond(reply: Reply, h: bytes = head(extra)) -> bool:
            await reply.write(h + text_event("a") + USAGE + DONE)
            return True

        [r], _, _ = run(respond)
        assert r.success and (r.served, r.decision) == want
