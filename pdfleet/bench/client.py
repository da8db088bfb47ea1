"""The benchmarks' streaming HTTP/1.1 client: times each stream's first SSE event and, if asked, every event.

One raw asyncio protocol per connection (no HTTP library), so that the client's core is not what limits
the load: the gateway benchmark drives tens of thousands of events per second through it, the simulator
benches hundreds of concurrent streams. It parses the response head, counts SSE events (`\\n\\n`), knows
when a response ends (Content-Length, the chunked terminator after `data: [DONE]`, or the server's close)
and keeps connections alive in a pool, as an HTTP client library (the OpenAI SDK's httpx pool) does.

    stats = Stats()
    client = StreamClient(port, request_bytes(port, "/v1/completions", body, keepalive=True), stats, True)
    span = Span(events=[])          # events=[]: also record when each event arrived
    await client.stream(span)       # stats.ttft, span.start / span.end / span.events (perf_counter s)

An event's time is when the read that completed it arrived (events read together share a time), the
way `vllm bench serve` stamps chunks; `data: [DONE]` is not an event there. Payloads are not parsed.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field
from typing import cast

NAN = float("nan")
_TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked body (no trailers here)
_DONE_EVENT = b"[DONE]\n\n"


@dataclass
class Stats:
    """What the client measured over all its streams: TTFTs, finished streams, events, failures, connects."""

    ttft: list[float] = field(default_factory=list)  # seconds, of the streams asked to record
    done: int = 0
    events: int = 0  # SSE events received, `data: [DONE]` included
    failed: int = 0
    connects: int = 0  # TCP connections opened: shows whether the server kept connections alive
    stale: int = 0  # kept-alive connections the server had closed before answering (retried)


@dataclass(slots=True)
class Span:
    """One stream's timeline in perf_counter seconds: start, end (NaN until then), and event times if asked.

    `events` is None (not recorded, the cheap default) or a list the client appends each event's
    arrival time to; `data: [DONE]` is not one.
    """

    start: float = NAN
    end: float = NAN
    events: list[float] | None = None


def request_bytes(
    port: int,
    path: str,
    body: bytes,
    key: str | None = None,
    keepalive: bool = False,
    host: str = "127.0.0.1",
) -> bytes:
    """The raw HTTP/1.1 POST a client sends (`Connection: close` unless kept alive)."""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    conn = "" if keepalive else "Connection: close\r\n"  # HTTP/1.1 keeps alive by default
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{auth}"
        f"Accept: text/event-stream\r\n{conn}Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class StreamConn(asyncio.Protocol):
    """One client connection carrying one streaming request at a time: TTFT, events, outcome.

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
        self.server_close = False
        self.waiter: asyncio.Future[str] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Connected: ready for a request."""
        # asyncio types the hook for every transport kind; a TCP connection always gets a Transport
        self.transport = cast(asyncio.Transport, transport)
        self.open = True

    def send(self, request: bytes, t0: float, record: bool, times: list[float] | None) -> asyncio.Future[str]:
        """Write one request; the future resolves when its response is over."""
        assert self.transport is not None and self.waiter is None
        self.t0, self.record, self.times = t0, record, times
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
        """Parse the head once, then count and time events; finish when a kept-alive body ends."""
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
            if n and (not self.first or self.times is not None):
                self._stamp(n, data)
            self.stats.events += n
            if not self.saw_done and (b"[DONE]" in data or b"[DONE]" in self.tail + data[:6]):
                self.saw_done = True
            self.tail = data[-8:] if len(data) >= 8 else (self.tail + data)[-8:]
            self.body += len(data)
        if self.keepalive and not self.server_close and self._complete():
            self._finish("done" if self.ok and self.saw_done else "failed")

    def _stamp(self, n: int, data: bytes) -> None:
        """Time the `n` events this read completed: the stream's TTFT, and each event when recording."""
        now = time.perf_counter()
        if not self.first:
            self.first = True
            if self.record:
                self.stats.ttft.append(now - self.t0)
        if self.times is not None:
            # 7 bytes of overlap: a "[DONE]\n\n" (8 bytes) that ends in this read is counted once
            n -= (self.tail[-7:] + data).count(_DONE_EVENT)
            self.times.extend([now] * n)

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
        """The server hung up: the response ends here (stale if a reused connection got no byte)."""
        self.open = False
        if self.waiter is None:
            return
        if not self.got and self.served:
            self._finish("stale")
        else:
            self._finish("done" if self.ok and self.saw_done else "failed")


class StreamClient:
    """Runs streams of one request against one port: a new connection per stream, or from a keep-alive pool.

    The pool is what an HTTP client library keeps (the OpenAI SDK's httpx pool): a stream takes an idle
    connection (the most recently used) and opens a new one only when none is idle.
    """

    def __init__(
        self, port: int, request: bytes, stats: Stats, keepalive: bool, host: str = "127.0.0.1"
    ) -> None:
        self.port, self.request, self.stats, self.keepalive, self.host = port, request, stats, keepalive, host
        self.idle: list[StreamConn] = []
        self.conns: weakref.WeakSet[StreamConn] = weakref.WeakSet()

    async def _connect(self) -> StreamConn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: StreamConn(self.stats, self.keepalive), self.host, self.port
        )
        self.stats.connects += 1
        self.conns.add(conn)
        return conn

    def _take_idle(self) -> StreamConn | None:
        while self.idle:
            conn = self.idle.pop()
            if conn.open:
                return conn
        return None

    async def stream(self, span: Span, record: bool = True) -> None:
        """One stream; TTFT counts from here (connect included when a new connection is needed).

        `span` gets the start and end times (for the time-average of streams in flight) and, if its
        `events` is a list, every event's arrival time. `record`: add this stream's TTFT to the stats.
        """
        t0 = span.start = time.perf_counter()
        while True:  # ends: a fresh connection is never stale
            conn = self._take_idle()
            if conn is None:
                try:
                    conn = await self._connect()
                except OSError:
                    self.stats.failed += 1
                    span.end = time.perf_counter()
                    await asyncio.sleep(0.05)  # closed loop: do not spin on a refusing server
                    return
            outcome = await conn.send(self.request, t0, record, span.events)
            if outcome != "stale":
                break
            self.stats.stale += 1
        span.end = time.perf_counter()
        if outcome == "done" and self.keepalive and conn.open and not conn.server_close:
            self.idle.append(conn)

    def close(self) -> None:
        """Close every connection still open (idle ones, and those of abandoned streams)."""
        self.idle.clear()
        for conn in list(self.conns):
            if conn.transport is not None and conn.open:
                conn.transport.close()
