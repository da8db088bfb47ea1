"""Benchmark helpers for bench/gateway_overhead.py: a cheap SSE upstream and a cheap streaming client.

Both speak just enough HTTP/1.1 over raw asyncio protocols (uvloop) that they cost little CPU, so the
proxy under test (the gateway or nginx) is what the numbers describe.

Client: `Client(port, request_bytes(...), stats, keepalive)`; `await client.stream(record, span)` runs one
stream, on a new connection each time (`Connection: close`) or on a connection from a keep-alive pool.

Upstream: `python bench/gateway_upstream.py --port P`. Each POST body's JSON gives `max_tokens` and
`bench: {first_ms, gap_ms}`; the reply is a chunked `text/event-stream` of `max_tokens` OpenAI-style
chunk events `gap_ms` apart after `first_ms`, then `data: [DONE]`. Keep-alive is supported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import weakref
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
    """What the client measured: TTFTs, finished streams, events, failures, connections opened."""

    ttft: list[float] = field(default_factory=list)
    done: int = 0
    events: int = 0
    failed: int = 0
    connects: int = 0  # TCP connections opened: shows whether the server kept connections alive
    stale: int = 0  # kept-alive connections the server had closed before answering (retried)


_TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked body (no trailers here)


class ClientConn(asyncio.Protocol):
    """One client connection carrying one streaming request at a time: TTFT, event count, outcome.

    A response ends when the server closes the connection (always so with `Connection: close`) or, on a
    kept-alive connection, when its body ends: a Content-Length body fully read, or the chunked
    terminator after `data: [DONE]` (SSE payloads never contain it, so the byte check is enough here).
    `send` resolves to "done", "failed" or "stale" (a reused connection closed before any reply byte).
    """

    def __init__(self, stats: Stats, keepalive: bool) -> None:
        self.stats, self.keepalive = stats, keepalive
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.served = 0
        self.waiter: asyncio.Future[str] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True

    def send(self, request: bytes, t0: float, record: bool) -> asyncio.Future[str]:
        """Write one request; the future resolves when its response is over."""
        assert self.transport is not None and self.waiter is None
        self.t0, self.record = t0, record
        self.head, self.tail = b"", b""
        self.in_body = self.first = self.ok = self.saw_done = self.got = self.server_close = False
        self.length: int | None = None
        self.body = 0
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def _parse_head(self, head: bytes) -> None:
        self.ok = head.startswith(b"HTTP/1.1 200")
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                self.length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                self.server_close = True

    def data_received(self, data: bytes) -> None:
        if self.waiter is None:
            return  # nothing asked: ignore stray bytes
        self.got = True
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            self._parse_head(self.head[:end])
            data = self.head[end + 4 :]
            self.in_body = True
        if data:
            n = (self.tail[-1:] + data).count(b"\n\n")  # one byte of overlap: a split "\n\n" counts once
            if n and not self.first:
                self.first = True
                if self.record:
                    self.stats.ttft.append(time.perf_counter() - self.t0)
            self.stats.events += n
            if not self.saw_done and (b"[DONE]" in data or b"[DONE]" in self.tail + data[:6]):
                self.saw_done = True
            self.tail = data[-8:] if len(data) >= 8 else (self.tail + data)[-8:]
            self.body += len(data)
        if self.keepalive and not self.server_close and self._complete():
            self._finish("done" if self.ok and self.saw_done else "failed")

    def _complete(self) -> bool:
        if self.length is not None:
            return self.body >= self.length
        return (self.saw_done or not self.ok) and self.tail.endswith(_TERMINATOR)

    def _finish(self, outcome: str) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            return  # the stream was abandoned (cancelled): not counted
        if outcome == "done":
            self.stats.done += 1
            self.served += 1
        elif outcome == "failed":
            self.stats.failed += 1
        if outcome != "done" and self.transport is not None:
            self.transport.close()  # unknown state: never reuse
        waiter.set_result(outcome)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if self.waiter is None:
            return
        if not self.got and self.served:
            self._finish("stale")
        else:
            self._finish("done" if self.ok and self.saw_done else "failed")


def request_bytes(port: int, path: str, body: bytes, key: str | None, keepalive: bool = False) -> bytes:
    """The raw HTTP/1.1 request a client sends (`Connection: close` unless kept alive)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    conn = "" if keepalive else "Connection: close\r\n"  # HTTP/1.1 keeps alive by default
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{auth}"
        f"Accept: text/event-stream\r\n{conn}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Client:
    """Runs streams against one port: a new connection per stream, or reuse from a keep-alive pool.

    The pool is what an HTTP client library keeps (the OpenAI SDK's httpx pool): a stream takes an idle
    connection (the most recently used) and opens a new one only when none is idle.
    """

    def __init__(self, port: int, request: bytes, stats: Stats, keepalive: bool) -> None:
        self.port, self.request, self.stats, self.keepalive = port, request, stats, keepalive
        self.idle: list[ClientConn] = []
        self.conns: weakref.WeakSet[ClientConn] = weakref.WeakSet()

    async def _connect(self) -> ClientConn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: ClientConn(self.stats, self.keepalive), "127.0.0.1", self.port
        )
        self.stats.connects += 1
        self.conns.add(conn)
        return conn

    def _take_idle(self) -> ClientConn | None:
        while self.idle:
            conn = self.idle.pop()
            if conn.open:
                return conn
        return None

    async def stream(self, record: bool, span: list[float]) -> None:
        """One stream; TTFT counts from here (connect included when a new connection is needed).

        `span` gets [start, end] perf_counter times, for the time-average of streams in flight.
        """
        t0 = span[0] = time.perf_counter()
        outcome = "stale"
        while outcome == "stale":  # ends: a fresh connection is never stale
            conn = self._take_idle()
            if conn is None:
                try:
                    conn = await self._connect()
                except OSError:
                    self.stats.failed += 1
                    span[1] = time.perf_counter()
                    await asyncio.sleep(0.05)  # closed loop: do not spin on a refusing server
                    return
            outcome = await conn.send(self.request, t0, record)
            self.stats.stale += outcome == "stale"
        span[1] = time.perf_counter()
        if outcome == "done" and self.keepalive and conn.open and not conn.server_close:
            self.idle.append(conn)

    def close(self) -> None:
        """Close every connection still open (idle ones, and those of abandoned streams)."""
        self.idle.clear()
        for conn in list(self.conns):
            if conn.transport is not None and conn.open:
                conn.transport.close()


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
