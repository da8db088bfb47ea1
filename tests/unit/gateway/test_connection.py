"""An upstream connection against raw loopback servers: the body reassembled from any split and every
framing, keep-alive reuse, failures after the first byte, and the relay's framing and backpressure."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdfleet.gateway.connection import ends_answer
from pdfleet.gateway.upstream import UpstreamClient
from tests.unit.gateway.helpers import RawServer, chunked, client_pair, fetch, run_uvloop


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c for c in cuts if 0 < c < len(data)})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


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

    run_uvloop(scenario())


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

    run_uvloop(scenario())


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

    run_uvloop(scenario())


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

    run_uvloop(scenario())


@pytest.mark.parametrize(
    ("piece", "last"),
    [
        (b'data: {"n": 1}\n\ndata: [DONE]\n\n', True),
        (b"data: [DONE]\r\n\r\n", True),
        (b'event: message_stop\ndata: {"type": "message_stop"}\n\n', True),
        (b'data: {"n": 1}\n\n', False),
        (b'data: {"text": "say data: [DONE]"}\n\n', False),  # the words inside an answer's text
        (b'data: {"text": "\\nevent: message_stop"}\n\n', False),
    ],
)
def test_ends_answer_knows_each_api_s_last_event(piece: bytes, last: bool) -> None:
    assert ends_answer(piece) is last
