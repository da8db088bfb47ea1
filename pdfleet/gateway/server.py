"""The gateway's client side of HTTP: aiohttp's server protocol with the policy's client bounds, and
protocol errors answered as OpenAI errors.

aiohttp answers a request it cannot parse with a plain-text 400 quoting the offending line (an
`Authorization` line included) and logs an ERROR traceback with it; its keep-alive default is an hour
and it has no deadline for a request head. Here a protocol error is an OpenAI error object whose
message names the kind of problem and quotes nothing the client sent, logged as one rate-limited
line; a head must complete within `clients.header_timeout_s` of its first byte, an idle connection
closes after `clients.idle_timeout_s`, and one address holds at most
`clients.max_connections_per_address` connections (the next one gets a 429 and is closed).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast

from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo

from pdfleet.gateway.errors import error_body, error_response
from pdfleet.gateway.policy_spec import ClientSpec

log = logging.getLogger("pdfleet.gateway")


class UnsupportedRequestLine(hx.BadStatusLine):
    """A request line llhttp parses but the gateway does not serve: no version (HTTP/0.9 style), a
    version other than 1.0 or 1.1, no target, or CONNECT (the gateway is no proxy; aiohttp would hand
    the connection over as a tunnel, past every deadline)."""


# what the parser's exception class says, in words that quote nothing (most specific class first)
_PROBLEMS: tuple[tuple[type[Exception], str], ...] = (
    (
        UnsupportedRequestLine,
        "the request line is not 'METHOD /path HTTP/1.1' (HTTP/1.0 and 1.1 only, a target, no CONNECT)",
    ),
    (hx.LineTooLong, "the request line or a header line is longer than the gateway's limit of 8190 bytes"),
    (
        hx.BadHttpMethod,
        "the request line does not start with an HTTP method (TLS sent to a plain HTTP port?)",
    ),
    (hx.BadStatusLine, "the request line is not 'METHOD /path HTTP/1.1'"),
    (hx.InvalidURLError, "the request target is not a valid URL path"),
    (hx.ContentEncodingError, "the Content-Encoding is not one the gateway decodes (gzip, deflate)"),
    (hx.TransferEncodingError, "the Transfer-Encoding is malformed or not chunked"),
    (hx.ContentLengthError, "the Content-Length is malformed"),
    (
        hx.BadHttpMessage,
        "a header line is malformed (a control character, a bare CR or LF, a folded line, "
        "a space before the colon, a repeated Content-Length or too many headers)",
    ),
)
# llhttp's own reason ("Invalid header value char") heads its message; it is a constant of the parser,
# kept only when it looks like one (letters and spaces), never the quoted bytes after it
_PARSER_REASON = re.compile(r"([A-Za-z][A-Za-z ]{2,60}):\n\n")


def unsupported_request(message: RawRequestMessage) -> bool:
    """Whether a parsed request line is one the gateway refuses (see UnsupportedRequestLine)."""
    return (
        message.version not in (HttpVersion10, HttpVersion11)
        or not message.path
        or message.method == "CONNECT"
    )


def describe_protocol_error(exc: BaseException | None) -> str:
    """A message for an unparsable request that names the problem and never quotes the request."""
    text = "the request is not valid HTTP/1.1"
    for cls, problem in _PROBLEMS:
        if isinstance(exc, cls):
            text = problem
            break
    found = _PARSER_REASON.match(getattr(exc, "message", "") or "")
    if found:
        reason = found.group(1)
        if type(exc) is hx.BadHttpMessage and "chunk" in reason.lower():
            text = "the chunked body framing is malformed"
        text += f" (parser: {reason})"
    return f"malformed HTTP request: {text}; header values are not echoed"


class LogLimiter:
    """At most `burst` lines per `window_s`: lines any client can cause must not flood the journal."""

    def __init__(self, burst: int = 5, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self.window_start = -float("inf")
        self.used = 0
        self.suppressed = 0

    def admit(self) -> int | None:
        """None: drop this line. Else log it, noting the returned count of lines dropped before it."""
        now = self.clock()
        if now - self.window_start >= self.window_s:
            self.window_start, self.used = now, 0
        if self.used >= self.burst:
            self.suppressed += 1
            return None
        self.used += 1
        dropped, self.suppressed = self.suppressed, 0
        return dropped


def raw_error(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response carrying an OpenAI error, for when there is no request to answer."""
    body = error_body(status, message, code)
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class ClientServer(web.Server):
    """aiohttp's low-level server whose connections obey the policy's `clients` bounds.

    `limits` is read at each accept (a reload applies to new connections); `count` is told the status
    of every response this layer makes itself (protocol errors, timeouts, refused connections).
    """

    def __init__(
        self,
        handler: Any,
        limits: Callable[[], ClientSpec],
        count: Callable[[int], None],
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, handler_cancellation=True, access_log=None, **kwargs)
        self.limits = limits
        self.count = count
        self.per_address: dict[str, int] = {}
        self.log_limiter = LogLimiter()

    def __call__(self) -> RequestHandler:
        lim = self.limits()
        return _ClientProtocol(
            self, lim, loop=self._loop, keepalive_timeout=lim.idle_timeout_s, access_log=None
        )

    def note(self, fmt: str, *args: object) -> None:
        """One WARNING line about a misbehaving client, rate-limited."""
        dropped = self.log_limiter.admit()
        if dropped is None:
            return
        suffix = f" ({dropped} similar lines dropped before this one)" if dropped else ""
        log.warning(fmt + "%s", *args, suffix)


class _ClientProtocol(RequestHandler):
    """One client connection: aiohttp's request handling plus the head deadline, the per-address cap and
    protocol errors as OpenAI errors."""

    def __init__(self, server: ClientServer, limits: ClientSpec, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.server, self.limits = server, limits
        self.address: str | None = None
        self.refused = False
        self.head_timer: asyncio.TimerHandle | None = None
        self.head_count = 0
        self.last_payload: Any = None  # the body stream of the last request head parsed

    # ---- accept: the per-address cap -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if isinstance(peer, tuple) and peer else "-"
        held = self.server.per_address.get(address, 0)
        cap = self.limits.max_connections_per_address
        if held >= cap:
            self.refused = True
            self._refuse(cast(asyncio.Transport, transport), address, cap)  # a TCP server's: a Transport
            return
        self.address = address
        self.server.per_address[address] = held + 1
        super().connection_made(transport)

    def _refuse(self, transport: asyncio.Transport, address: str, cap: int) -> None:
        """Answer 429 and close: the connection never reaches aiohttp's request handling."""
        msg = f"too many connections from your address (at most {cap}); reuse keep-alive connections"
        transport.write(raw_error(429, msg, "too_many_connections"))
        if transport.can_write_eof():
            transport.write_eof()  # the client reads the 429, then sees the end
        # a client that never closes its side is cut after a second
        self._loop.call_later(1.0, transport.abort)
        self.server.count(429)
        self.server.note(
            "refused a connection from %s: it holds %d (clients.max_connections_per_address)", address, cap
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.refused:
            return
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None
        if self.address is not None:
            left = self.server.per_address.get(self.address, 1) - 1
            if left > 0:
                self.server.per_address[self.address] = left
            else:
                self.server.per_address.pop(self.address, None)
            self.address = None
        super().connection_lost(exc)

    # ---- the head deadline -------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.refused:
            return  # read and dropped, so closing sends no reset over the 429
        in_head = self.last_payload is None or self.last_payload.is_eof()
        count = self._request_count
        super().data_received(data)
        if self._request_count != count:  # one or more heads completed
            self._refuse_unsupported()
            self.last_payload = self._messages[-1][1] if self._messages else None
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
        elif in_head and data and self.head_timer is None:
            self.head_count = count
            self.head_timer = self._loop.call_later(self.limits.header_timeout_s, self._head_late)

    def _refuse_unsupported(self) -> None:
        """The first unsupported request line waiting becomes a protocol error (a 400 through
        handle_error, then close) and what follows it is dropped: nothing of it reaches a handler."""
        for i, (message, _) in enumerate(self._messages):
            if isinstance(message, RawRequestMessage) and unsupported_request(message):
                while len(self._messages) > i:
                    self._messages.pop()
                exc = UnsupportedRequestLine()
                self._messages.append((_ErrInfo(status=400, exc=exc, message=""), EMPTY_PAYLOAD))
                return

    def _head_late(self) -> None:
        """The head that began `header_timeout_s` ago is still not complete: 408 and close."""
        self.head_timer = None
        if self._request_count != self.head_count or self.transport is None or self._force_close:
            return
        if self._request_in_progress:  # a pipelined head behind a response still going out: after it
            self.head_timer = self._loop.call_later(self.limits.header_timeout_s, self._head_late)
            return
        t = self.limits.header_timeout_s
        self.transport.write(
            raw_error(408, f"the request head did not arrive within {t:g} s", "request_timeout")
        )
        self.server.count(408)
        self.server.note(
            "closed a connection from %s: request head not complete within %g s", self.address, t
        )
        self.force_close()

    # ---- protocol errors -------------------------------------------------------------------------

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's log of a failure outside a handler. A request body that cannot be read (its
        Content-Encoding does not decode, its framing is broken) shows up here when aiohttp reads the
        rest of a body the handler did not want: one rate-limited line, no traceback."""
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError | hx.HttpProcessingError):
            self.server.note("dropped the unreadable rest of a request body from %s", self.address)
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to an unparsable request (and, defensively, to a handler failure)."""
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error response")
        if status == 400:
            text = describe_protocol_error(exc)
            self.server.note("protocol error from %s: %s", self.address, text)
            resp = error_response(400, text, code="invalid_http_request")
        else:  # a handler failure: app.Gateway._dispatch answers those itself, so this is a bug
            log.error("unexpected error in the HTTP layer (%s)", type(exc).__name__ if exc else status)
            code = status if status >= 500 else 500
            resp = error_response(code, "internal gateway error; see the gateway log", code="internal_error")
        self.server.count(resp.status)
        resp.force_close()
        return resp
