"""A cheap paced SSE upstream, the fixed point the gateway-overhead benchmark streams through proxies from.

It speaks just enough HTTP/1.1 over a raw asyncio protocol (uvloop) that it costs little CPU, so the
proxy under test (the gateway or nginx) is what the numbers describe.

`python -m pdfleet.bench.upstream --port P`. Each POST body's JSON gives `max_tokens` and
`bench: {first_ms, gap_ms}` (see `paced_body`); the reply is a chunked `text/event-stream` of
`max_tokens` OpenAI-style chunk events `gap_ms` apart after `first_ms`, then `data: [DONE]`.
Keep-alive is supported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import cast

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


def paced_body(tokens: int, first_ms: float, gap_ms: float) -> bytes:
    """A streaming chat request asking the upstream for `tokens` events, the first after `first_ms`."""
    return json.dumps(
        {
            "model": "bench",
            "messages": [
                {"role": "user", "content": "Summarise the attached report in three bullet points."}
            ],
            "stream": True,
            "max_tokens": tokens,
            "bench": {"first_ms": first_ms, "gap_ms": gap_ms},
        }
    ).encode()


class UpstreamProtocol(asyncio.Protocol):
    """One upstream connection: parse requests, stream paced SSE replies, one at a time."""

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Connected: wait for a request."""
        # asyncio types the hook for every transport kind; a TCP connection always gets a Transport
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        """The client went away: stop pacing its reply."""
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        """Buffer the bytes; start the next reply once a whole request is in."""
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


async def _serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, "127.0.0.1", port, backlog=4096, reuse_address=True)
    print(f"upstream listening on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """`python -m pdfleet.bench.upstream --port P`: run the upstream until killed."""
    p = argparse.ArgumentParser(description="paced SSE upstream for the gateway benchmark")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    import uvloop

    uvloop.run(_serve(args.port))


if __name__ == "__main__":
    main()
