"""The benchmarks' streaming client: times each stream as `vllm bench serve` does, one Record per request.

One raw asyncio protocol per connection (HTTP/1.1, keep-alive pool, chunked transfer decoding, SSE
framing; no HTTP library), so that the client's core is not what limits the load: `invoke bench` keeps
a thousand streams on schedule with it, the gateway benchmark drives tens of thousands of events per
second through it. Per request a `Record`: when it was due, began and ended, TTFT (the first content
event), the arrival time of every content event (their gaps are vLLM's ITL), the output token count
from the final `usage` event, and an error text when it failed (HTTP status and message, a refused
connection, a stream that ended before `data: [DONE]`). Nothing is dropped: a failed request is a
record with its error. `Stats` adds up what every request of one client saw (TTFTs, streams, events,
connects).

    client = StreamClient("127.0.0.1", port)
    rec = Record()
    await client.run(request_bytes("127.0.0.1", port, "/v1/completions", body), rec)

`parse=True` (the default) reads each event's JSON: content events are those whose first choice
carries text, `usage` and vLLM's in-stream error events are kept. `parse=False` reads no payload (the
benchmarks' own upstream and the simulator send only content events): every SSE event but
`data: [DONE]` is a content event, and a chunked body's events are counted in its raw bytes (half the
CPU per event: the gateway benchmark's client must not be what limits it). An event's time is when the
read that completed it arrived (events read together share a time), the way `vllm bench serve` stamps
chunks.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from pdfleet.bench.http_request import request_bytes as request_bytes  # built there, imported from here too

try:  # a vllm-router dependency; ~5x faster than json on small events
    import orjson

    _loads: Callable[[str | bytes], Any] = orjson.loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads

NAN = float("nan")
_DONE = b"data: [DONE]"
_DONE_END = b"[DONE]\n\n"  # the end of the `data: [DONE]` event
_TERMINATOR = b"0\r\n\r\n"  # the last chunk of a chunked body (no trailers here)


@dataclass(slots=True)
class Record:
    """One request as the client saw it; times are perf_counter seconds, NaN until known.

    The first five fields say what was asked (`invoke bench` fills them; the other benches need not).
    """

    index: int = 0
    pool: str = ""
    length_class: str = ""
    prompt_tokens: int = 0
    max_tokens: int = 0
    due: float = NAN  # scheduled start (s from the run's start)
    start: float = NAN
    end: float = NAN  # when the response ended (NaN: it never did, e.g. abandoned)
    ttft: float = NAN  # s from start to the first content event
    chunks: list[float] = field(default_factory=list)  # arrival of every content event
    output_tokens: int | None = None  # usage.completion_tokens
    status: int = 0
    error: str = ""
    # stopped by the operator (Ctrl-C) or abandoned after the drain: not the server's fault
    cancelled: bool = False
    instance: int | None = None  # the colocated instance that served it (the gateway's X-Pdfleet-Instance)
    served: str = ""  # the pool that served it (the gateway's X-Pdfleet-Pool; "" when not said)
    decision: str = ""  # the gateway decider's reason (X-Pdfleet-Decision; "" when not said)

    @property
    def success(self) -> bool:
        """Finished with HTTP 200, `data: [DONE]` and at least one content event (vLLM's `success`)."""
        return not self.error and bool(self.chunks)

    @property
    def latency(self) -> float:
        """E2E as vLLM times it: start to the last content event (not the usage event)."""
        return self.chunks[-1] - self.start if self.chunks else NAN


@dataclass
class Stats:
    """What one client measured over all its requests: TTFTs, finished streams, events, failures, connects."""

    ttft: list[float] = field(default_factory=list)  # seconds, of the requests asked to record
    done: int = 0  # ended with HTTP 200 and `data: [DONE]`
    events: int = 0  # SSE events received, `data: [DONE]` included
    failed: int = 0
    connects: int = 0  # TCP connections opened: shows whether the server kept connections alive
    stale: int = 0  # kept-alive connections the server had closed before answering (retried)


def _content(event: dict[str, Any]) -> bool:
    """True when an event's first choice carries text (completions) or delta content (chat)."""
    choices = event.get("choices")
    if not choices:
        return False
    first = choices[0]
    text = first.get("text")
    if text is None:
        text = (first.get("delta") or {}).get("content")
    return bool(text)


class _Conn(asyncio.Protocol):
    """One connection carrying one request at a time; parses the head, the body's framing and SSE events."""

    def __init__(self, stats: Stats, parse: bool) -> None:
        self.stats, self.parse = stats, parse
        self.transport: asyncio.Transport | None = None
        self.open = False
        self.rec: Record | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.stale = False  # closed by the server before any byte of the answer (a kept-alive conn timed out)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Connected: ready for a request."""
        # asyncio types the hook for every transport kind; a TCP connection always gets a Transport
        self.transport = cast(asyncio.Transport, transport)
        self.open = True

    def send(self, request: bytes, rec: Record, record: bool) -> asyncio.Future[None]:
        """Write one request for `rec`; the future resolves when its response is over."""
        assert self.transport is not None
        self.rec, self.record, self.buf, self.events = rec, record, bytearray(), bytearray()
        self.head_done = self.chunked = self.done = self.got = self.close_after = False
        self.tail = b""  # the last bytes read (counting mode: events split over reads counted once)
        self.length: int | None = None
        self.left = 0  # bytes left in the current chunk (chunked) or body (Content-Length)
        self.body = bytearray()  # a non-SSE body (an error), kept for its message
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        """Feed bytes through head, transfer decoding and SSE framing; finish when the body ends."""
        if self.rec is None:
            return  # nothing asked: ignore stray bytes
        self.got = True
        now = time.perf_counter()
        self.buf += data
        if not self.head_done and not self._head():
            return
        if self.chunked and not self.parse and self.rec.status == 200:
            self._count(now)
        elif self.chunked:
            self._dechunk(now)
        else:
            take = bytes(self.buf) if self.length is None else bytes(self.buf[: self.left])
            del self.buf[: len(take)]
            self._payload(take, now)
            if self.length is not None:
                self.left -= len(take)
                if self.left <= 0:
                    self._end()

    def _head(self) -> bool:
        """Parse the response head once it is complete; False while it is not."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self.buf[:end]).split(b"\r\n")
        del self.buf[: end + 4]
        assert self.rec is not None
        parts = lines[0].split(b" ", 2)
        self.rec.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value:
                self.chunked = True
            elif name == b"content-length":
                self.length = self.left = int(value)
            elif name == b"connection" and value == b"close":
                self.close_after = True
            elif name == b"x-pdfleet-instance" and value.isdigit():
                self.rec.instance = int(value)
            elif name == b"x-pdfleet-pool":
                self.rec.served = value.decode("ascii", "replace")
            elif name == b"x-pdfleet-decision":
                self.rec.decision = value.decode("ascii", "replace")
        self.head_done = True
        if self.length == 0:
            self._end()
        return True

    def _count(self, now: float) -> None:
        """Counting mode: events counted in the raw bytes, chunk framing not decoded (half the CPU per
        event; a chunk-size line never holds a blank line); the body ends at the terminator after
        `data: [DONE]`."""
        data = bytes(self.buf)
        self.buf.clear()
        n = (self.tail[-1:] + data).count(b"\n\n")  # one byte of overlap: a split "\n\n" counts once
        dones = (self.tail[-7:] + data).count(_DONE_END)  # likewise a split [DONE] event
        self.stats.events += n
        self.done = self.done or dones > 0
        if n > dones:
            self._chunks(n - dones, now)
        self.tail = (self.tail + data)[-8:]
        if self.done and self.tail.endswith(_TERMINATOR):
            self._end()

    def _dechunk(self, now: float) -> None:
        """Decode the chunked transfer encoding: payload bytes to _payload, the last chunk to _end."""
        while self.rec is not None:
            if self.left > 0:
                piece = bytes(self.buf[: self.left])
                if not piece:
                    return
                del self.buf[: len(piece)]
                self.left -= len(piece)
                self._payload(piece, now)
                if self.left == 0:
                    self.left = -2  # the CRLF after a chunk's data
                continue
            if self.left < 0:
                if len(self.buf) < 2:
                    return
                del self.buf[:2]
                self.left = 0
                continue
            eol = self.buf.find(b"\r\n")
            if eol < 0:
                return
            size = int(bytes(self.buf[:eol]).split(b";", 1)[0], 16)
            del self.buf[: eol + 2]
            if size == 0:
                self._end()
                return
            self.left = size

    def _payload(self, data: bytes, now: float) -> None:
        """Body bytes: SSE events of a 200 answer (framed at blank lines), else the error body kept."""
        rec = self.rec
        assert rec is not None
        if rec.status != 200:
            self.body += data[: 4096 - len(self.body)]
            return
        self.events += data
        if b"\n\n" not in self.events:
            return
        *events, rest = bytes(self.events).split(b"\n\n")
        self.events = bytearray(rest)
        self.stats.events += len(events)
        if self.parse:
            for event in events:
                self._event(event, now)
            return
        content = 0
        for event in events:
            if event.rstrip() == _DONE:
                self.done = True
            else:
                content += 1
        if content:
            self._chunks(content, now)

    def _chunks(self, n: int, now: float) -> None:
        """`n` content events arrived now: the first one is the TTFT."""
        rec = self.rec
        assert rec is not None
        if not rec.chunks:
            rec.ttft = now - rec.start
            if self.record:
                self.stats.ttft.append(rec.ttft)
        rec.chunks.extend([now] * n)

    def _event(self, event: bytes, now: float) -> None:
        """One SSE event, parsed: content events are timed, usage kept, an error event recorded."""
        rec = self.rec
        assert rec is not None
        if not event.startswith(b"data:"):
            return
        data = event[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            doc = _loads(data)
        except ValueError:
            rec.error = rec.error or f"an event that is not JSON: {data[:80]!r}"
            return
        if not isinstance(doc, dict):
            return
        if _content(doc):
            self._chunks(1, now)
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            rec.output_tokens = usage["completion_tokens"]
        if isinstance(doc.get("error"), dict):  # vLLM's in-stream error event
            rec.error = f"error event: {str(doc['error'].get('message', doc['error']))[:200]}"

    def _end(self) -> None:
        """The response is over: settle the record's outcome and wake the sender."""
        rec, waiter = self.rec, self.waiter
        self.rec = self.waiter = None
        if rec is None or waiter is None or waiter.done():
            return  # the request was abandoned (cancelled)
        if rec.status != 200:
            rec.error = rec.error or f"HTTP {rec.status}: {_message(bytes(self.body))}"
        elif not self.done and not rec.error:
            rec.error = f"the stream ended before data: [DONE] after {len(rec.chunks)} token event(s)"
        if rec.error or self.close_after:
            self._close()
        waiter.set_result(None)

    def _close(self) -> None:
        """Close the connection (never reused after an error)."""
        if self.transport is not None:
            self.transport.close()
        self.open = False

    def connection_lost(self, exc: Exception | None) -> None:
        """The server hung up: the response ends here (a body without length ends by closing)."""
        self.open = False
        if self.rec is not None and self.head_done and not self.chunked and self.length is None:
            self._end()
        elif self.rec is not None:
            rec = self.rec
            self.stale = not self.got
            if not rec.error:
                rec.error = (
                    "the connection closed before an answer"
                    if not self.got
                    else f"the connection closed mid-stream after {len(rec.chunks)} token event(s)"
                )
            self._end()


def _message(body: bytes) -> str:
    """The error message of an OpenAI/vLLM error body, else its first bytes."""
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if err:
            return str(err)[:300]
    except ValueError:
        pass
    return body[:300].decode("utf-8", "replace").strip() or "(no body)"


class StreamClient:
    """Runs requests against one host:port over a pool of kept-alive connections (the SDK's httpx way).

    A request takes the most recently used idle connection and opens a new one only when none is idle;
    with `keepalive=False` (requests sent with `Connection: close`) every request has its own.
    """

    def __init__(
        self,
        host: str,
        port: int,
        stats: Stats | None = None,
        keepalive: bool = True,
        parse: bool = True,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port, self.keepalive, self.parse = host, port, keepalive, parse
        self.tls = tls  # HTTPS: the context the server's certificate and name are verified with
        self.stats = Stats() if stats is None else stats
        self.idle: list[_Conn] = []
        self.every: set[_Conn] = set()

    async def run(self, request: bytes, rec: Record, record: bool = True) -> None:
        """Send one request; `rec` gets its timings or its error. Never raises for the server's faults.

        TTFT counts from here (connect included when a new connection is needed); `record`: add this
        request's TTFT to the stats. A kept-alive connection the server closed before answering is
        retried on another (a fresh connection is never stale).
        """
        rec.start = time.perf_counter()
        while True:
            conn = self._take_idle()
            reused = conn is not None
            if conn is None:
                try:
                    _, conn = await asyncio.get_running_loop().create_connection(
                        lambda: _Conn(self.stats, self.parse),
                        self.host,
                        self.port,
                        ssl=self.tls,
                        server_hostname=self.host if self.tls is not None else None,
                    )
                except OSError as err:  # ssl.SSLError (an untrusted certificate) is one
                    rec.error = f"cannot connect to {self.host}:{self.port} ({err.strerror or err})"
                    rec.end = time.perf_counter()
                    self.stats.failed += 1
                    return
                self.stats.connects += 1
                self.every.add(conn)
            try:
                await conn.send(request, rec, record)
            except asyncio.CancelledError:
                conn._close()
                raise
            if not (reused and conn.stale):
                break
            self.stats.stale += 1
            self.every.discard(conn)
            rec.error, rec.status = "", 0
        rec.end = time.perf_counter()
        self.stats.failed += bool(rec.error)
        self.stats.done += not rec.error
        if conn.open and not rec.error and self.keepalive:
            self.idle.append(conn)
        else:
            conn._close()
            self.every.discard(conn)

    def _take_idle(self) -> _Conn | None:
        """The most recently used open idle connection, if any."""
        while self.idle:
            conn = self.idle.pop()
            if conn.open:
                return conn
            self.every.discard(conn)
        return None

    def close(self) -> None:
        """Close every connection (idle ones and those of cancelled requests)."""
        for conn in list(self.every):
            conn._close()
        self.every.clear()
        self.idle.clear()
