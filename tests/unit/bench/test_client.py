"""The streaming client against a scripted loopback server: TTFT, every event's time, outcomes, the pool."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pdfleet.bench.client import Span, Stats, StreamClient, request_bytes
from pdfleet.bench.procs import free_port
from pdfleet.bench.stats import itl
from tests.unit.bench.helpers import DONE, SSE_HEAD, Reply, ScriptedServer, event

PATH = "/v1/chat/completions"


def _client(port: int, keepalive: bool = True, body: bytes = b"{}") -> StreamClient:
    return StreamClient(port, request_bytes(port, PATH, body, keepalive=keepalive), Stats(), keepalive)


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> float:
    """Wait (yielding to the loop) until check() holds; when it was seen to hold."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "the client never got there"
        await asyncio.sleep(0.001)
    return time.perf_counter()


def _stream_once(respond: Callable[..., Any], span: Span) -> tuple[Stats, list[float]]:
    """One recorded stream against a scripted server: the client's stats and the server's write stamps."""

    async def main() -> tuple[Stats, list[float]]:
        async with ScriptedServer(respond) as server:
            client = _client(server.port)
            await client.stream(span)
            client.close()
            return client.stats, server.replies[0].stamps

    return asyncio.run(main())


def test_ttft_and_every_event_time_lie_between_the_write_and_the_clients_receipt() -> None:
    """Each event's time is after the server wrote it and before the server saw it recorded."""
    span = Span(events=[])
    seen: list[float] = []
    delays = [0.05, 0.03, 0.08]

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD)
        for i, delay in enumerate(delays):
            await asyncio.sleep(delay)
            await reply.write(event(f"t{i}"))
            seen.append(await _until(lambda i=i: len(span.events) > i))
        await reply.write(DONE)
        return True

    stats, stamps = _stream_once(respond, span)
    written = stamps[1:4]  # the head first, [DONE] last
    assert len(span.events) == 3  # [DONE] is no event
    assert all(w <= t <= s for w, t, s in zip(written, span.events, seen, strict=True))
    assert stats.ttft == [span.events[0] - span.start]
    assert stats.ttft[0] >= delays[0]
    # each gap is at least the server's pause between the client's receipt and the next write
    assert all(g >= d for g, d in zip(itl(span.events), delays[1:], strict=True))
    assert span.start <= span.events[0] <= span.events[-1] <= span.end
    assert (stats.done, stats.failed, stats.events, stats.connects) == (1, 0, 4, 1)


def test_events_read_together_share_one_time_and_a_split_event_counts_once() -> None:
    """Two events in one write get one time (a zero gap); an event split over writes is one event."""
    span = Span(events=[])
    two = event("a") + event("b")
    split = event("c")

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + two)
        await _until(lambda: len(span.events) == 2)
        await reply.write(split[:20])
        await asyncio.sleep(0.02)
        await reply.write(split[20:])
        cut = DONE.index(b"NE]")
        await reply.write(DONE[:cut])  # [DONE] split over two reads: still no event, still the end
        await asyncio.sleep(0.02)
        await reply.write(DONE[cut:])
        return True

    stats, stamps = _stream_once(respond, span)
    assert len(span.events) == 3
    assert span.events[0] == span.events[1]
    assert span.events[2] >= stamps[2]  # when the second half of the split event was written
    assert (stats.done, stats.failed, stats.events) == (1, 0, 4)


def test_kept_alive_streams_share_one_connection_and_close_opens_one_each() -> None:
    """keepalive: the pool reuses the idle connection; close: `Connection: close`, a connection per stream."""

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + event("x") + DONE)
        return True

    async def run(keepalive: bool) -> tuple[Stats, list[bytes]]:
        async with ScriptedServer(respond) as server:
            client = _client(server.port, keepalive)
            for _ in range(3):
                await client.stream(Span())
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

    async def main() -> tuple[Stats, Span]:
        async with ScriptedServer(respond) as server:
            client = _client(server.port)
            await client.stream(Span())
            span = Span(events=[])
            await client.stream(span)
            client.close()
            return client.stats, span

    stats, span = asyncio.run(main())
    assert (stats.done, stats.failed, stats.stale, stats.connects) == (2, 0, 1, 2)
    assert len(span.events) == 1


def test_an_error_reply_fails_and_its_connection_is_not_reused() -> None:
    """A 503 with a body is a failed stream; the next stream opens a new connection."""

    async def respond(reply: Reply) -> bool:
        if reply.number == 0:
            await reply.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
        else:
            await reply.write(SSE_HEAD + event("x") + DONE)
        return True

    async def main() -> tuple[Stats, Span]:
        async with ScriptedServer(respond) as server:
            client = _client(server.port)
            span = Span()
            await client.stream(span)
            await client.stream(Span())
            client.close()
            return client.stats, span

    stats, span = asyncio.run(main())
    assert (stats.failed, stats.done, stats.connects) == (1, 1, 2)
    assert len(stats.ttft) == 1  # the failed stream had no event, so no TTFT
    assert span.end >= span.start


def test_a_refused_connection_is_a_failed_stream() -> None:
    """Nothing listening: the stream fails (and ends) instead of raising."""

    async def main() -> tuple[Stats, Span]:
        client = _client(free_port())
        span = Span()
        await client.stream(span)
        return client.stats, span

    stats, span = asyncio.run(main())
    assert (stats.failed, stats.done, stats.connects) == (1, 0, 0)
    assert span.end >= span.start


def test_streams_not_asked_to_record_leave_no_ttft_and_no_event_times() -> None:
    """record=False: counted, not timed; a Span without a list records no event times."""

    async def respond(reply: Reply) -> bool:
        await reply.write(SSE_HEAD + event("x") + event("y") + DONE)
        return True

    async def main() -> tuple[Stats, Span]:
        async with ScriptedServer(respond) as server:
            client = _client(server.port)
            span = Span()
            await client.stream(span, record=False)
            client.close()
            return client.stats, span

    stats, span = asyncio.run(main())
    assert (stats.ttft, stats.done, stats.events, span.events) == ([], 1, 3, None)


def test_request_bytes_frame_one_post() -> None:
    """Host, key, content type and length; `Connection: close` only when not kept alive."""
    raw = request_bytes(8000, PATH, b'{"a":1}', key="sk-1", host="10.0.0.1")
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
    kept = request_bytes(8000, PATH, b"{}", keepalive=True).decode()
    assert "Connection" not in kept and "Authorization" not in kept and "Host: 127.0.0.1:8000" in kept
