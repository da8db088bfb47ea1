"""One keep-alive HTTP/1.1 connection to a pool: one request at a time, a first-byte wait, a direct relay.

Why not aiohttp's client: its per-chunk reader hop (parser -> StreamReader -> waking the handler task
-> writer) was most of the gateway's CPU per chunk. Here the response head is parsed once
(http1.py) and each body piece goes from `data_received` straight to the client's transport, with no
task switch per chunk. A failure before the first body byte is an `UpstreamError` (reason
"bad_response" when the origin sent something that is not a valid response); after it, the relay ends
with "upstream_error".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal, Protocol, cast

from pdfleet.gateway.http1 import MAX_HEAD, ResponseParser

Reason = Literal["connect", "timeout", "disconnect", "bad_response"]
EndReason = Literal["timeout", "upstream_error", "client_gone"]

# client write buffer bounds: above HIGH the upstream is paused until the client drains below LOW
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024
_DRAIN_POLL_S = 0.005


class UpstreamError(Exception):
    """An upstream attempt that failed before its first body byte."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: Reason = reason


@dataclass
class UpstreamResponse:
    """An upstream response whose head (and first body bytes, or its end) arrived in time."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated headers keep the last value
    content_length: int | None
    first: bytes
    at_eof: bool  # the whole body is in `first`
    t_first: float
    _conn: Connection | None = None
    # body pieces that arrived before relay() attached a client, and how the body ended meanwhile
    _pending: list[bytes] = field(default_factory=list)
    _ended: bool = False
    _end_reason: EndReason | None = None
    last_piece: bytes = b""  # the last piece relayed: read (ends_answer) only when the client leaves

    @property
    def answered(self) -> bool:
        """Whether the last piece relayed ended the answer (a client leaving after it was served)."""
        return ends_answer(self.last_piece)

    def relay(
        self,
        transport: asyncio.Transport,
        chunked: bool,
        on_chunk: Callable[[], None] | None,
        idle_s: float,
        held: bytes | None = None,
    ) -> asyncio.Future[EndReason | None]:
        """Write every further body piece to `transport` as it comes (HTTP-chunk framed when `chunked`).

        `held` (an event stream: the bytes of `first` after its last whole event): only whole events
        are written, the rest held until its event ends, so a stream cut mid-event leaves the client
        at an event boundary, where an error event can follow (a partial event completed by it was
        unparsable JSON to the SDKs). The future resolves with None at a clean end, else with why the
        relay stopped (`timeout`: no body bytes for `idle_s`).
        """
        fut: asyncio.Future[EndReason | None] = asyncio.get_running_loop().create_future()
        for piece in self._pending:
            if held is not None:
                piece, held = whole_events(held + piece)
                if not piece:
                    continue
            transport.write(_frame(piece) if chunked else piece)
            self.last_piece = piece
            if on_chunk is not None:
                on_chunk()
        self._pending = []
        if self._ended:
            if held and self._end_reason is None:  # a clean end: what it held is the stream's tail
                transport.write(_frame(held) if chunked else held)
            fut.set_result(self._end_reason)
        elif self._conn is None:  # closed by its owner meanwhile
            fut.set_result("upstream_error")
        else:
            self._conn.start_relay(transport, chunked, on_chunk, idle_s, fut, held)
        return fut

    def close(self) -> None:
        """Drop the connection unless the body already ended cleanly (then it is back in the pool)."""
        conn, self._conn = self._conn, None
        if conn is not None and conn.response is self:
            conn.abort()


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def ends_answer(piece: bytes) -> bool:
    """Whether a relayed piece ends with an answer's last event (OpenAI's `data: [DONE]`, Anthropic's
    `message_stop`): the SDKs close on it, often before the body's end marker, and were served in full."""
    end = b"\n" + piece[-96:].rstrip(b"\r\n")
    return end.endswith(b"\ndata: [DONE]") or b"\nevent: message_stop" in end


def whole_events(data: bytes) -> tuple[bytes, bytes]:
    """An event stream's bytes split after its last whole event (a blank line ends one) and the rest;
    a rest past the write buffer's bound is not held (an upstream that never ends an event)."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    if len(data) - end > _HIGH_WATER:
        return data, b""
    return data[:end], data[end:]


class ConnectionPool(Protocol):
    """Where a connection goes back after a clean response, and leaves when it closes (the client)."""

    def release(self, conn: Connection) -> None:
        """Keep `conn` for the next request to its origin."""

    def forget(self, conn: Connection) -> None:
        """Drop `conn`: it is closed."""


class Connection(ResponseParser, asyncio.Protocol):
    """One keep-alive connection to an origin, carrying one request at a time."""

    def __init__(self, client: ConnectionPool, origin: Hashable) -> None:
        self.client, self.origin = client, origin  # origin: the key its pool keeps it under
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        """Per-request state."""
        self._reset_parser()
        self.got_body = False
        self.head_waiter: asyncio.Future[UpstreamResponse] | None = None
        self.first_timer: asyncio.TimerHandle | None = None
        self.response: UpstreamResponse | None = None
        # relay state
        self.sink: asyncio.Transport | None = None
        self.sink_chunked = False
        self.on_chunk: Callable[[], None] | None = None
        self.end: asyncio.Future[EndReason | None] | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.idle_s = 0.0
        self.last_data = 0.0
        self.paused = False
        self.drain_timer: asyncio.TimerHandle | None = None
        self.held: bytes | None = None  # an event stream's incomplete last event (None: not held back)

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types the hook for every transport kind; a TCP connection always gets a Transport
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.head_waiter is None and self.response is None:
            self.abort()  # bytes on an idle connection: the origin misbehaves, do not reuse it
            return
        if not self.in_body:
            self.head += data
            if not self._parse_head():
                if len(self.head) > MAX_HEAD and self.head_waiter is not None:
                    self._fail_head("bad_response", "response head too large")
                return
            data = bytes(self.head)
            self.head = bytearray()
        if data or (self.framing == "length" and self.remaining == 0):  # no body at all: ended already
            self._body(data)

    def eof_received(self) -> bool | None:
        if self.in_body and self.framing == "close":
            self.keep_alive = False
            self._ended(b"", None)
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.client.forget(self)
        if self.head_waiter is not None:
            self._fail_head("disconnect", "connection closed before the response")
        elif self.response is not None:
            self._ended(b"", "upstream_error")

    # ---- request and head ----------------------------------------------------------------------

    def send(self, request: bytes, first_byte_at: float) -> asyncio.Future[UpstreamResponse]:
        """Write the request; the future resolves once the head and first body bytes arrived."""
        assert self.transport is not None
        self.head_waiter = self.loop.create_future()
        self.first_timer = self.loop.call_at(first_byte_at, self._fail_head, "timeout", "no first byte")
        self.transport.write(request)
        return self.head_waiter

    def _head_error(self, detail: str) -> None:
        """A head the parser refuses fails the attempt: the origin answered, but not validly."""
        self._fail_head("bad_response", detail)

    def _fail_head(self, reason: Reason, detail: str) -> None:
        """The attempt failed before its first body byte: fail the waiter, drop the connection."""
        waiter = self.head_waiter
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(UpstreamError(reason, detail))

    # ---- body ----------------------------------------------------------------------------------

    def _deliver(self, payload: bytes) -> None:
        """Pass a payload piece on: to the first-byte waiter, the relay's client, or hold it."""
        self.got_body = True
        if self.head_waiter is not None:
            self._resolve_head(payload, at_eof=False)
            return
        sink = self.sink
        if sink is None:  # between the first byte and the relay's start: hold, within bounds
            assert self.response is not None
            pending = self.response._pending
            pending.append(payload)
            if not self.paused and self.transport is not None and sum(map(len, pending)) > _HIGH_WATER:
                self.paused = True
                self.transport.pause_reading()
            return
        if sink.is_closing():
            self._finish("client_gone")
            return
        if self.held is not None:
            payload, self.held = whole_events(self.held + payload)
            if not payload:  # part of an event: data all the same, not idle
                self.last_data = self.loop.time()
                return
        sink.write(_frame(payload) if self.sink_chunked else payload)
        if self.response is not None:
            self.response.last_piece = payload
        self.last_data = self.loop.time()
        if self.on_chunk is not None:
            self.on_chunk()
        if not self.paused and sink.get_write_buffer_size() > _HIGH_WATER and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
            self.drain_timer = self.loop.call_later(_DRAIN_POLL_S, self._poll_drain)

    def _poll_drain(self) -> None:
        """Resume reading the upstream once the slow client has drained its buffer."""
        self.drain_timer = None
        sink = self.sink
        if not self.paused or sink is None or self.transport is None:
            return
        if sink.is_closing():
            self._finish("client_gone")
        elif sink.get_write_buffer_size() <= _LOW_WATER:
            self.paused = False
            self.transport.resume_reading()
        else:
            self.last_data = self.loop.time()  # waiting on the client, not the upstream: not idle
            self.drain_timer = self.loop.call_later(_DRAIN_POLL_S, self._poll_drain)

    def _resolve_head(self, first: bytes, at_eof: bool) -> None:
        waiter, self.head_waiter = self.head_waiter, None
        if self.first_timer is not None:
            self.first_timer.cancel()
            self.first_timer = None
        resp = UpstreamResponse(
            self.status, self.headers, self.content_length, first, at_eof, time.perf_counter()
        )
        if at_eof:
            resp._ended = True
        else:
            resp._conn, self.response = self, resp
        if waiter is not None and not waiter.done():
            waiter.set_result(resp)

    def _ended(self, tail: bytes, reason: EndReason | None) -> None:
        """The body ended (None: cleanly) with `tail` as its last payload."""
        if self.head_waiter is not None:
            if reason is not None:
                self._fail_head("disconnect", "connection closed before the first byte")
                return
            self.got_body = self.got_body or bool(tail)
            self._resolve_head(tail, at_eof=True)
            self._release()
            return
        if tail:
            self._deliver(tail)
        if self.end is not None:
            self._finish(reason)
            return
        resp = self.response
        if resp is not None:  # no relay yet: leave the ending for relay() to report
            resp._ended, resp._end_reason, resp._conn = True, reason, None
        if reason is None:
            self._release()
        else:
            self.abort()

    def _protocol_error(self) -> None:
        """Broken body framing: before the first byte the attempt fails, after it the relay ends."""
        if self.head_waiter is not None:
            self._fail_head("bad_response", "malformed response body framing")
        else:
            self._ended(b"", "upstream_error")

    # ---- relay ---------------------------------------------------------------------------------

    def start_relay(
        self,
        transport: asyncio.Transport,
        chunked: bool,
        on_chunk: Callable[[], None] | None,
        idle_s: float,
        end: asyncio.Future[EndReason | None],
        held: bytes | None = None,
    ) -> None:
        """Attach the client transport: from now on body pieces go straight to it (whole events only
        when `held` is not None)."""
        self.sink, self.sink_chunked, self.on_chunk, self.end = transport, chunked, on_chunk, end
        self.held = held
        self.idle_s = idle_s
        self.last_data = self.loop.time()
        self.idle_timer = self.loop.call_at(self.last_data + idle_s, self._idle_check)
        if self.paused:  # paused while holding payload for the relay: resume once the client drains
            self._poll_drain()

    def _idle_check(self) -> None:
        # the deadline moves with every chunk; checking it only when the timer fires keeps the
        # per-chunk cost to one timestamp
        self.idle_timer = None
        if self.end is None:
            return
        due = self.last_data + self.idle_s
        if self.loop.time() >= due:
            self._finish("timeout")
        else:
            self.idle_timer = self.loop.call_at(due, self._idle_check)

    def _finish(self, reason: EndReason | None) -> None:
        """End the relay (None: clean end); pool the connection after a clean end, else drop it."""
        end, self.end = self.end, None
        held, self.held = self.held, None
        sink = self.sink
        if reason is None and held and sink is not None and not sink.is_closing():
            sink.write(_frame(held) if self.sink_chunked else held)  # a clean end: the stream's tail
        if reason is None:
            self._release()
        else:
            self.abort()
        if end is not None and not end.done():
            end.set_result(reason)

    def _release(self) -> None:
        """Detach the response and pool the connection when it can carry another request."""
        resp, self.response = self.response, None
        if resp is not None:
            resp._conn = None
        for timer in (self.idle_timer, self.drain_timer, self.first_timer):
            if timer is not None:
                timer.cancel()
        transport = self.transport
        reusable = self.keep_alive and transport is not None and not transport.is_closing()
        if reusable and self.paused and transport is not None:
            transport.resume_reading()
        self._reset()
        if reusable:
            self.client.release(self)
        else:
            self.abort()

    def abort(self) -> None:
        """Close the connection at once (its state is unknown or unwanted); it carries nothing more."""
        self.keep_alive = False
        for timer in (self.idle_timer, self.drain_timer, self.first_timer):
            if timer is not None:
                timer.cancel()
        self.idle_timer = self.drain_timer = self.first_timer = None
        self.head_waiter = None
        if self.response is not None:
            self.response._conn = None
            self.response = None
        if self.transport is not None:
            transport, self.transport = self.transport, None
            transport.abort()
        self.client.forget(self)
