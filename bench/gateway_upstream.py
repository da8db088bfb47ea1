"""Benchmark helpers for bench/gateway_overhead.py: a cheap SSE upstream and a cheap streaming client.

Both speak just enough HTTP/1.1 over raw asyncio protocols (uvloop) that they cost little CPU, so the
proxy under test (the gateway or nginx) is what the numbers describe.

Upstream: `python bench/gateway_upstream.py --port P`. Each POST body's JSON gives `max_tokens` and
`bench: {first_ms, gap_ms}`; the reply is a chunked `text/event-stream` of `max_tokens` OpenAI-style
chunk events `gap_ms` apart after `first_ms`, then `data: [DONE]`. Keep-alive is supported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field

_HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_EVENT = _chunk(
    b'data: {"id":"cmpl-b","object":"chat.completion.chunk","created":0,"model":"bench",'
    b'"choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}\n\n'
)
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class UpstreamProtocol(asyncio.Protocol):
    """One upstream connection: parse requests, stream paced SSE replies, one at a time."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        if self.busy or self.transport is None:
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].decode("latin-1")
        length = 0
        self.close_after = False
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                self.close_after = True
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        try:
            req = json.loads(body)
            n = int(req.get("max_tokens", 16))
            cfg = req.get("bench", {})
            first, gap = cfg.get("first_ms", 20) / 1000, cfg.get("gap_ms", 20) / 1000
        except (ValueError, TypeError, AttributeError):
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            return
        self.busy = True
        self.transport.write(_HEADERS)
        self.timer = asyncio.get_running_loop().call_later(first, self._emit, n, gap)

    def _emit(self, left: int, gap: float) -> None:
        if self.transport is None:
            return
        if left == 0:
            self.transport.write(_DONE)
            if self.close_after:
                self.transport.close()
                return
            self.busy = False
            self.timer = None
            self._next()
            return
        self.transport.write(_EVENT)
        self.timer = asyncio.get_running_loop().call_later(gap, self._emit, left - 1, gap)


@dataclass
class Stats:
    """What the client measured: TTFTs, finished streams, events, failures."""

    ttft: list[float] = field(default_factory=list)
    done: int = 0
    events: int = 0
    failed: int = 0


class ClientProtocol(asyncio.Protocol):
    """One streaming request on its own connection (Connection: close): TTFT, event count, outcome."""

    def __init__(self, request: bytes, stats: Stats, done: asyncio.Future[None], t0: float, record: bool):
        self.request, self.stats, self.done, self.t0, self.record = request, stats, done, t0, record
        self.head = b""
        self.in_body = False
        self.tail = b""
        self.first = False
        self.ok = False
        self.saw_done = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self.ok = self.head.startswith(b"HTTP/1.1 200")
            data = self.head[end + 4 :]
            self.in_body = True
        if not data:
            return
        n = (self.tail[-1:] + data).count(b"\n\n")  # one byte of overlap: a split "\n\n" counts once
        if n and not self.first:
            self.first = True
            if self.record:
                self.stats.ttft.append(time.perf_counter() - self.t0)
        self.stats.events += n
        if not self.saw_done and b"[DONE]" in self.tail + data:
            self.saw_done = True
        self.tail = data[-8:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ok and self.saw_done:
            self.stats.done += 1
        else:
            self.stats.failed += 1
        if not self.done.done():
            self.done.set_result(None)


def request_bytes(port: int, path: str, body: bytes, key: str | None) -> bytes:
    """The raw HTTP/1.1 request a client sends (Connection: close: one stream per connection)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{auth}"
        f"Accept: text/event-stream\r\nConnection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def one_stream(port: int, request: bytes, stats: Stats, record: bool) -> None:
    """Open a connection, send one request, wait until the server closes it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    t0 = time.perf_counter()
    try:
        await loop.create_connection(
            lambda: ClientProtocol(request, stats, done, t0, record), "127.0.0.1", port
        )
    except OSError:
        stats.failed += 1
        await asyncio.sleep(0.05)
        return
    await done


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=4096, reuse_address=True)
    print(f"upstream listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description="paced SSE upstream for the gateway benchmark")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args()
    import uvloop

    uvloop.run(_serve(args.port))


if __name__ == "__main__":
    main()
