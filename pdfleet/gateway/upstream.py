"""The gateway's upstream HTTP/1.1 client: keep-alive connections, a first-byte wait, a direct relay.

Why not aiohttp's client: the gateway only POSTs JSON to a few pool origins and copies the answer to
its own client, and aiohttp's general-purpose request setup and its per-chunk reader hop (parser ->
StreamReader -> waking the handler task -> writer) were most of the gateway's CPU per request and per
chunk. Here a request is one write, the response head is parsed once, and each body piece goes from
`data_received` straight to the client's transport, with no task switch per chunk.

Only what pools speak is supported: HTTP/1.1 responses framed by chunked encoding, Content-Length or
connection close; http and https origins. Everything else is a protocol error (reason "disconnect"
before the first byte, "upstream_error" after it).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from yarl import URL

Reason = Literal["connect", "timeout", "disconnect"]
EndReason = Literal["timeout", "upstream_error", "client_gone"]

_MAX_HEAD = 64 * 1024
# vLLM's API server (uvicorn) closes idle keep-alive connections after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE);
# reusing only younger ones keeps a request from racing that close
_IDLE_REUSE_S = 4.0
# client write buffer bounds: above HIGH the upstream is paused until the client drains below LOW
_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024
_DRAIN_POLL_S = 0.005


class UpstreamError(Exception):
    """An upstream attempt that failed before its first body byte."""

    def __init__(self, reason: Reason, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason: Reason = reason


@dataclass(frozen=True)
class Origin:
    """Where a pool listens (scheme, host, port) and the Host header that names it."""

    scheme: str
    host: str
    port: int
    host_header: str

    @classmethod
    def parse(cls, base_url: str) -> Origin:
        """The origin of a policy base URL (already validated as http(s) with a host)."""
        url = URL(base_url)
        host = url.host or ""
        port = url.port or (443 if url.scheme == "https" else 80)
        shown = f"[{host}]" if ":" in host else host
        if not url.is_default_port():
            shown += f":{port}"
        return cls(url.scheme, host, port, shown)


@dataclass
class UpstreamResponse:
    """An upstream response whose head (and first body bytes, or its end) arrived in time."""

    status: int
    headers: dict[str, str]  # lower-case names; repeated headers keep the last value
    content_length: int | None
    first: bytes
    at_eof: bool  # the whole body is in `first`
    t_first: float
    _conn: _Connection | None = None
    # body pieces that arrived before relay() attached a client, and how the body ended meanwhile
    _pending: list[bytes] = field(default_factory=list)
    _ended: bool = False
    _end_reason: EndReason | None = None

    def relay(
        self,
        transport: asyncio.Transport,
        chunked: bool,
        on_chunk: Callable[[], None] | None,
        idle_s: float,
    ) -> asyncio.Future[EndReason | None]:
        """Write every further body piece to `transport` as it comes (HTTP-chunk framed when `chunked`).

        The future resolves with None at a clean end, else with why the relay stopped (`timeout`:
        no body bytes for `idle_s`).
        """
        fut: asyncio.Future[EndReason | None] = asyncio.get_running_loop().create_future()
        for piece in self._pending:
            transport.write(_frame(piece) if chunked else piece)
            if on_chunk is not None:
                on_chunk()
        self._pending = []
        if self._ended:
            fut.set_result(self._end_reason)
        elif self._conn is None:  # closed by its owner meanwhile
            fut.set_result("upstream_error")
        else:
            self._conn.start_relay(transport, chunked, on_chunk, idle_s, fut)
        return fut

    def close(self) -> None:
        """Drop the connection unless the body already ended cleanly (then it is back in the pool)."""
        conn, self._conn = self._conn, None
        if conn is not None and conn.response is self:
            conn.abort()


def _frame(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class _Connection(asyncio.Protocol):
    """One keep-alive connection to an origin, carrying one request at a time."""

    def __init__(self, client: UpstreamClient, origin: Origin) -> None:
        self.client, self.origin = client, origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        """Per-request state."""
        self.head = bytearray()
        self.in_body = False
        self.framing = "close"  # chunked | length | close
        self.remaining = 0  # length: body bytes left; chunked: bytes left of this chunk + its CRLF
        self.chunk_state = 0  # chunked framing: 0 size line, 1 data, 2 trailers, 3 done
        self.line = bytearray()  # a chunk-size or trailer line split across reads
        self.keep_alive = True
        self.got_body = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content_length: int | None = None
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

    # ---- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.head_waiter is None and self.response is None:
            self.abort()  # bytes on an idle connection: the origin misbehaves, do not reuse it
            return
        if not self.in_body:
            self.head += data
            if not self._parse_head():
                if len(self.head) > _MAX_HEAD and self.head_waiter is not None:
                    self._fail_head("disconnect", "response head too large")
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

    def _parse_head(self) -> bool:
        """Parse the status line and headers once the blank line arrived; skip 1xx interim heads."""
        while True:
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return False
            lines = bytes(self.head[:end]).decode("latin-1").split("\r\n")
            del self.head[: end + 4]
            version, _, rest = lines[0].partition(" ")
            code = rest[:3]
            if not version.startswith("HTTP/1.") or not code.isdigit():
                self._fail_head("disconnect", f"not an HTTP/1.x response: {lines[0][:80]!r}")
                return False
            status = int(code)
            if 100 <= status < 200:
                continue
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    self._fail_head("disconnect", "malformed response header line")
                    return False
                headers[name.strip().lower()] = value.strip()
            return self._framing(version, status, headers)

    def _framing(self, version: str, status: int, headers: dict[str, str]) -> bool:
        """Decide how the body ends (chunked, Content-Length, close) and whether the connection stays."""
        self.status, self.headers, self.in_body = status, headers, True
        self.keep_alive = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
        te = headers.get("transfer-encoding", "").lower()
        if te:
            if te.rsplit(",", 1)[-1].strip() != "chunked":
                self._fail_head("disconnect", f"unsupported Transfer-Encoding {te!r}")
                return False
            self.framing = "chunked"
        elif status in (204, 304):
            self.framing, self.remaining, self.content_length = "length", 0, 0
        elif "content-length" in headers:
            cl = headers["content-length"]
            if not cl.isdigit():
                self._fail_head("disconnect", f"bad Content-Length {cl!r}")
                return False
            self.framing, self.remaining = "length", int(cl)
            self.content_length = self.remaining
        else:
            self.framing, self.keep_alive = "close", False
        return True

    def _fail_head(self, reason: Reason, detail: str) -> None:
        """The attempt failed before its first body byte: fail the waiter, drop the connection."""
        waiter = self.head_waiter
        self.abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(UpstreamError(reason, detail))

    # ---- body ----------------------------------------------------------------------------------

    def _body(self, data: bytes) -> None:
        """Take body bytes off the wire framing and pass the payload on."""
        if self.framing == "chunked":
            pieces = self._dechunk(data)
            if pieces is None:
                return
            payload = pieces[0] if len(pieces) == 1 else b"".join(pieces)
            done = self.chunk_state == 3
        elif self.framing == "length":
            if len(data) > self.remaining:
                self._protocol_error()
                return
            self.remaining -= len(data)
            payload, done = data, self.remaining == 0
        else:
            payload, done = data, False
        if done:
            self._ended(payload, None)
        elif payload:
            self._deliver(payload)

    def _dechunk(self, data: bytes) -> list[bytes] | None:
        """Payload slices of chunked-encoded `data` (None after a framing error); state 3 at the end."""
        out: list[bytes] = []
        i, n = 0, len(data)
        while i < n:
            st = self.chunk_state
            if st == 1:  # chunk data, then its CRLF (both counted in remaining)
                take = min(self.remaining, n - i)
                data_part = min(take, self.remaining - 2)
                if data_part > 0:
                    out.append(data[i : i + data_part])
                self.remaining -= take
                i += take
                if self.remaining == 0:
                    self.chunk_state = 0
                continue
            if st == 3:  # bytes after the message: not something a pool sends
                self._protocol_error()
                return None
            j = data.find(b"\n", i)
            if j < 0:
                self.line += data[i:]
                if len(self.line) > 4096:
                    self._protocol_error()
                    return None
                return out
            if self.line:
                self.line += data[i:j]
                line = bytes(self.line).rstrip(b"\r")
                self.line.clear()
            else:
                line = data[i:j].rstrip(b"\r")
            i = j + 1
            if st == 0:
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    self._protocol_error()
                    return None
                if size < 0:
                    self._protocol_error()
                    return None
                self.chunk_state, self.remaining = (2, 0) if size == 0 else (1, size + 2)
            elif not line:  # st == 2: the blank line after the (ignored) trailers
                self.chunk_state = 3
        return out

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
        sink.write(_frame(payload) if self.sink_chunked else payload)
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
        if self.head_waiter is not None:
            self._fail_head("disconnect", "malformed response body framing")
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
    ) -> None:
        """Attach the client transport: from now on body pieces go straight to it."""
        self.sink, self.sink_chunked, self.on_chunk, self.end = transport, chunked, on_chunk, end
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
        reusable = self.keep_alive and self.transport is not None and not self.transport.is_closing()
        if reusable and self.paused:
            self.transport.resume_reading()  # type: ignore[union-attr]
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


class UpstreamClient:
    """Keep-alive connections per origin, most recently used first."""

    def __init__(self) -> None:
        self._idle: dict[Origin, dict[_Connection, None]] = {}
        self._origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None

    def origin(self, base_url: str) -> Origin:
        """The parsed origin of a base URL, cached."""
        found = self._origins.get(base_url)
        if found is None:
            found = self._origins[base_url] = Origin.parse(base_url)
        return found

    async def post(
        self,
        base_url: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        *,
        connect_s: float,
        first_byte_s: float,
    ) -> UpstreamResponse:
        """POST `body`; return once the head and the first body bytes (or the body's end) arrived.

        `first_byte_s` bounds the whole wait (connect included); raises UpstreamError otherwise.
        A reused keep-alive connection closed before any response byte is retried once on a new
        connection: that is an origin closing an idle connection (its keep-alive timeout) as the request
        went out, not an answer to it.
        """
        origin = self.origin(base_url)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + first_byte_s
        head = [f"POST {path} HTTP/1.1\r\nHost: {origin.host_header}\r\n"]
        for name, value in headers.items():
            if "\r" not in value and "\n" not in value:
                head.append(f"{name}: {value}\r\n")
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        request = "".join(head).encode("latin-1", "replace") + body
        for attempt in range(2):
            conn = await self._acquire(origin, min(connect_s, deadline - loop.time()), reuse=attempt == 0)
            waiter = conn.send(request, deadline)
            try:
                return await waiter
            except UpstreamError as exc:
                if not (conn.reused and exc.reason == "disconnect" and not conn.got_body):
                    raise
            except BaseException:
                conn.abort()
                raise
        raise UpstreamError("disconnect", "connection closed before the response")

    async def _acquire(self, origin: Origin, connect_s: float, reuse: bool) -> _Connection:
        """An idle connection young enough to reuse (when `reuse`), else a new one within `connect_s`."""
        idle = self._idle.get(origin) if reuse else None
        now = time.monotonic()
        while idle:
            conn, _ = idle.popitem()
            alive = conn.transport is not None and not conn.transport.is_closing()
            if alive and now - conn.idle_since < _IDLE_REUSE_S:
                conn.reused = True
                return conn
            conn.abort()
        if connect_s <= 0:
            raise UpstreamError("timeout", "no time left to connect")
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if origin.scheme == "https" else None
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, origin),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                )
        except TimeoutError:
            raise UpstreamError("timeout", f"connect to {origin.host}:{origin.port} timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise UpstreamError("connect", f"{origin.host}:{origin.port}: {exc}") from None
        return conn

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def release(self, conn: _Connection) -> None:
        """Put a connection whose response ended cleanly back for reuse."""
        conn.idle_since = time.monotonic()
        conn.reused = False
        self._idle.setdefault(conn.origin, {})[conn] = None

    def forget(self, conn: _Connection) -> None:
        """Drop a closed connection from the idle set."""
        idle = self._idle.get(conn.origin)
        if idle is not None:
            idle.pop(conn, None)

    def close(self) -> None:
        """Close every idle connection (shutdown)."""
        for idle in self._idle.values():
            for conn in list(idle):
                conn.abort()
        self._idle.clear()
