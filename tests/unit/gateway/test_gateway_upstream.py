"""The gateway's upstream client against raw loopback servers that send exactly the bytes a test chooses:
framing (chunked split anywhere, Content-Length, close-delimited, 1xx), keep-alive reuse and the stale
connection retry, failures before and after the first byte, and backpressure from a slow client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from pdfleet.gateway.connection import UpstreamError
from pdfleet.gateway.upstream import Origin, UpstreamClient

Reply = Callable[[bytes], list[bytes]]  # request bytes -> the pieces written back, in order


@dataclass
class RawServer:
    """A loopback server that answers each request with `reply(request)` pieces, `gap` seconds apart."""

    reply: Reply
    gap: float = 0.0
    close_after_reply: bool = False
    # drop the connection, unanswered, on the request after this many replies on it: an origin closing
    # an idle keep-alive connection just as the next request goes out
    drop_after: int | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                req = head + await reader.readexactly(length)
                self.requests.append(req)
                if self.drop_after is not None and served >= self.drop_after:
                    break
                served += 1
                for piece in self.reply(req):
                    writer.write(piece)
                    await writer.drain()
                    if self.gap:
                        await asyncio.sleep(self.gap)
                if self.close_after_reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunked(*payloads: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + body
        + (b"0\r\n\r\n")
    )


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


class Sink(asyncio.Protocol):
    """The client side of a real loopback connection: collects what the relay wrote."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.data += data


async def client_pair() -> tuple[asyncio.Transport, Sink, asyncio.AbstractServer]:
    """A connected (transport we write to, sink that receives) pair over loopback TCP."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)  # type: ignore[arg-type]

    server = await loop.create_server(Accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    sink = Sink()
    await loop.create_connection(lambda: sink, "127.0.0.1", port)
    return await accepted, sink, server


async def fetch(
    client: UpstreamClient, url: str, *, first_byte_s: float = 5.0, idle_s: float = 5.0
) -> tuple[int, bytes, str | None]:
    """POST, then relay the rest (unframed) into a real socket; (status, whole body, end reason)."""
    resp = await client.post(url, "/v1/completions", {}, b"{}", connect_s=1, first_byte_s=first_byte_s)
    transport, sink, server = await client_pair()
    try:
        reason = await resp.relay(transport, False, None, idle_s)
        await asyncio.sleep(0.02)
        return resp.status, resp.first + bytes(sink.data), reason
    finally:
        transport.close()
        server.close()


def run(coro: object) -> None:
    uvloop.run(coro)  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=400), max_size=8))
def test_chunked_body_split_anywhere_is_reassembled_and_connection_reused(cuts: list[int]) -> None:
    payloads = [b'data: {"n": %d}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]
    wire = chunked(*payloads)

    async def scenario() -> None:
        async with RawServer(lambda _req: split(wire, cuts)) as srv:
            client = UpstreamClient()
            for _ in range(3):
                status, body, reason = await fetch(client, srv.url)
                assert (status, body, reason) == (200, b"".join(payloads), None)
            assert srv.connections == 1  # kept alive and reused
            client.close()

    run(scenario())


def test_request_head_and_body_on_the_wire() -> None:
    async def scenario() -> None:
        async with RawServer(lambda _req: [chunked(b"x")]) as srv:
            client = UpstreamClient()
            headers = {"Content-Type": "application/json", "X-Request-Id": "r1", "Accept": "a\r\nX-Evil: 1"}
            resp = await client.post(
                srv.url, "/v1/chat/completions", headers, b'{"a":1}', connect_s=1, first_byte_s=5
            )
            assert resp.first == b"x"
            req = srv.requests[0]
            head, body = req.split(b"\r\n\r\n")
            lines = head.split(b"\r\n")
            assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
            assert f"Host: {srv.url.removeprefix('http://')}".encode() in lines
            assert b"X-Request-Id: r1" in lines and b"Content-Length: 7" in lines
            assert not any(b"Evil" in line for line in lines)  # a header value with CR/LF is dropped
            assert body == b'{"a":1}'
            client.close()

    run(scenario())


def test_content_length_close_delimited_and_interim_heads() -> None:
    doc = json.dumps({"choices": [{"text": "x" * 5000}]}).encode()
    replies: dict[str, list[bytes]] = {
        "length": [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(doc), doc[:100], doc[100:]],
        "close": [b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n", doc],
        "interim": [
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(doc),
            doc,
        ],
        "empty": [b"HTTP/1.1 204 No Content\r\n\r\n"],
    }

    async def scenario() -> None:
        for kind, pieces in replies.items():
            srv = RawServer(lambda _req, p=pieces: p, gap=0.01, close_after_reply=kind == "close")
            async with srv:
                client = UpstreamClient()
                status, body, reason = await fetch(client, srv.url)
                assert reason is None, kind
                assert body == (b"" if kind == "empty" else doc), kind
                assert status == (204 if kind == "empty" else 200)
                client.close()

    run(scenario())


def test_failures_before_the_first_byte_name_their_reason() -> None:
    async def scenario() -> None:
        client = UpstreamClient()
        with socket.socket() as s:  # a port with nothing listening
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        with pytest.raises(UpstreamError) as err:
            await client.post(dead, "/v1/completions", {}, b"{}", connect_s=1, first_byte_s=5)
        assert err.value.reason == "connect"
        bad = {
            "disconnect": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"],  # then closes
            "garbage": [b"SSH-2.0-OpenSSH\r\n\r\n"],
            "bad-length": [b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n"],
            "bad-te": [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"],
        }
        for kind, pieces in bad.items():
            async with RawServer(lambda _req, p=pieces: p, close_after_reply=True) as srv:
                with pytest.raises(UpstreamError) as err:
                    await client.post(srv.url, "/v1/completions", {}, b"{}", connect_s=1, first_byte_s=5)
                assert err.value.reason == "disconnect", kind
        async with RawServer(lambda _req: [], gap=0) as srv:  # reads the request, never answers
            with pytest.raises(UpstreamError) as err:
                await client.post(srv.url, "/v1/completions", {}, b"{}", connect_s=1, first_byte_s=0.2)
            assert err.value.reason == "timeout"
        client.close()

    run(scenario())


def test_failures_after_the_first_byte_end_the_relay_with_a_reason() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    cases = {
        "upstream_error": [head + b"3\r\nabc\r\n", b"zz\r\n"],  # a chunk size that is not hex
        "cut": [head + b"3\r\nabc\r\n", b"5\r\nab"],  # connection closed inside a chunk
    }

    async def scenario() -> None:
        for kind, pieces in cases.items():
            async with RawServer(lambda _req, p=pieces: p, gap=0.02, close_after_reply=True) as srv:
                client = UpstreamClient()
                _, body, reason = await fetch(client, srv.url)
                assert reason == "upstream_error", kind
                assert body.startswith(b"abc"), kind
                client.close()
        async with RawServer(lambda _req: [head + b"3\r\nabc\r\n", b"3\r\ndef\r\n"], gap=0.6) as srv:
            client = UpstreamClient()
            _, body, reason = await fetch(client, srv.url, idle_s=0.2)
            assert reason == "timeout" and body == b"abc"
            client.close()

    run(scenario())


def test_stale_keep_alive_connection_is_retried_on_a_new_one() -> None:
    async def scenario() -> None:
        # closed after its reply (the close arrives while idle): not reused, a new connection each time
        async with RawServer(lambda _req: [chunked(b"ok")], close_after_reply=True) as srv:
            client = UpstreamClient()
            for _ in range(3):
                assert (await fetch(client, srv.url))[1] == b"ok"
                await asyncio.sleep(0.05)
            assert srv.connections == 3 and len(srv.requests) == 3
            client.close()
        # closed only when the next request arrives: that request is retried once on a new connection
        async with RawServer(lambda _req: [chunked(b"ok")], drop_after=1) as srv:
            client = UpstreamClient()
            for _ in range(3):
                assert (await fetch(client, srv.url))[1] == b"ok"
            assert srv.connections == 3
            assert len(srv.requests) == 5  # requests 2 and 3 each reached a dropped connection first
            client.close()

    run(scenario())


def test_relay_frames_for_a_chunked_client_and_pauses_for_a_slow_one() -> None:
    piece = b"y" * 65536
    pieces = 160  # 10 MiB: more than the loopback socket buffers hold

    async def scenario() -> None:
        wire_head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        wire = [wire_head] + [b"%x\r\n%s\r\n" % (len(piece), piece)] * pieces + [b"0\r\n\r\n"]
        async with RawServer(lambda _req: wire) as srv:
            client = UpstreamClient()
            resp = await client.post(srv.url, "/v1/completions", {}, b"{}", connect_s=1, first_byte_s=5)
            transport, sink, server = await client_pair()
            sink.transport.pause_reading()  # the client stops reading
            peak = 0

            def watch() -> None:
                nonlocal peak
                peak = max(peak, transport.get_write_buffer_size())

            end = resp.relay(transport, True, watch, 5.0)
            await asyncio.sleep(0.5)
            # the relay stopped reading the upstream instead of buffering the rest in the gateway
            assert not end.done()
            assert transport.get_write_buffer_size() < 512 * 1024
            sink.transport.resume_reading()
            assert await asyncio.wait_for(end, 10) is None
            await asyncio.sleep(0.1)
            assert peak < 512 * 1024
            # the client got HTTP chunk framing of exactly the payload
            got, decoded, i = bytes(sink.data), bytearray(resp.first), 0
            while i < len(got):
                j = got.index(b"\r\n", i)
                size = int(got[i:j], 16)
                decoded += got[j + 2 : j + 2 + size]
                assert got[j + 2 + size : j + 4 + size] == b"\r\n"
                i = j + 4 + size
            assert bytes(decoded) == piece * pieces
            transport.close()
            server.close()
            client.close()

    run(scenario())


def test_origin_host_header() -> None:
    assert Origin.parse("http://10.0.0.1:8000").host_header == "10.0.0.1:8000"
    assert Origin.parse("http://router.local").host_header == "router.local"
    assert Origin.parse("https://[::1]:9443") == Origin("https", "::1", 9443, "[::1]:9443")
