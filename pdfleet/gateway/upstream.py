"""The gateway's upstream HTTP/1.1 client: keep-alive connections per pool origin, one write per request.

Why not aiohttp's client: the gateway only POSTs JSON to a few pool origins and copies the answer to
its own client, and aiohttp's general-purpose request setup was a large part of the gateway's CPU per
request. Here a request is one write on a pooled connection (connection.py), which then relays the
response body straight to the gateway's client. http and https origins.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Hashable
from dataclasses import dataclass

from yarl import URL

from pdfleet.gateway.connection import Connection, UpstreamError, UpstreamResponse

# vLLM's API server (uvicorn) closes idle keep-alive connections after 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE);
# reusing only younger ones keeps a request from racing that close
_IDLE_REUSE_S = 4.0


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


class UpstreamClient:
    """Keep-alive connections per origin, most recently used first."""

    def __init__(self) -> None:
        # keyed by the connection's own `origin` (an Origin, typed Hashable by connection.py, below us)
        self._idle: dict[Hashable, dict[Connection, None]] = {}
        self._origins: dict[str, Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._reaper: asyncio.TimerHandle | None = None

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

    async def _acquire(self, origin: Origin, connect_s: float, reuse: bool) -> Connection:
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
                    lambda: Connection(self, origin),
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

    def release(self, conn: Connection) -> None:
        """Put a connection whose response ended cleanly back for reuse."""
        conn.idle_since = time.monotonic()
        conn.reused = False
        self._idle.setdefault(conn.origin, {})[conn] = None
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().call_later(_IDLE_REUSE_S, self._reap)

    def _reap(self) -> None:
        """Close the idle connections too old to be reused: reuse takes the youngest, so after a burst
        the rest stayed open for good (issue 27 N17: 500 file descriptors after a burst of 500)."""
        self._reaper = None
        now = time.monotonic()
        due: float | None = None
        for idle in self._idle.values():
            while idle:  # oldest first: a dict keeps the order connections came back in
                conn = next(iter(idle))
                if now - conn.idle_since < _IDLE_REUSE_S:
                    due = min(due, conn.idle_since) if due is not None else conn.idle_since
                    break
                del idle[conn]
                conn.abort()
        if due is not None:
            delay = max(0.05, due + _IDLE_REUSE_S - now)
            self._reaper = asyncio.get_running_loop().call_later(delay, self._reap)

    def forget(self, conn: Connection) -> None:
        """Drop a closed connection from the idle set."""
        idle = self._idle.get(conn.origin)
        if idle is not None:
            idle.pop(conn, None)

    def close(self) -> None:
        """Close every idle connection (shutdown)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for idle in self._idle.values():
            for conn in list(idle):
                conn.abort()
        self._idle.clear()
