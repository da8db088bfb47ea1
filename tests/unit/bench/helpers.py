"""Loopback servers for the bench library's tests: scripted SSE, the paced upstream, plain-text HTTP."""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from types import TracebackType

from pdfleet.bench.upstream import UpstreamProtocol

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
TERMINATOR = b"0\r\n\r\n"


def chunk(payload: bytes) -> bytes:
    """One piece of a chunked HTTP body."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(text: str) -> bytes:
    """One SSE chunk event carrying `text`, in its own body chunk."""
    return chunk(b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n' % text.encode())


DONE = chunk(b"data: [DONE]\n\n") + TERMINATOR


class Reply:
    """The server's side of one request: write pieces of the response, each stamped with perf_counter."""

    def __init__(self, writer: asyncio.StreamWriter, index: int, number: int) -> None:
        self.writer = writer
        self.index = index  # 0 for a connection's first request, 1 for the next one on it, ...
        self.number = number  # 0 for the server's first request, 1 for the next one on any connection, ...
        self.stamps: list[float] = []  # perf_counter just before each write

    async def write(self, data: bytes) -> float:
        """Write `data` now and return when it was written."""
        stamp = time.perf_counter()
        self.stamps.append(stamp)
        self.writer.write(data)
        await self.writer.drain()
        return stamp


# A respond function answers one request; returning False closes the connection afterwards.
Respond = Callable[[Reply], Awaitable[bool]]


class ScriptedServer:
    """An HTTP/1.1 server on 127.0.0.1 whose replies a test scripts; real sockets, in the test's loop."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.requests: list[bytes] = []
        self.replies: list[Reply] = []
        self.port = 0
        self._open: dict[asyncio.StreamWriter, asyncio.Task[None]] = {}

    async def __aenter__(self) -> ScriptedServer:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.close()
        # hang up on every connection and let its handler end by itself (a cancelled one gets logged)
        handlers = list(self._open.values())
        for writer in list(self._open):
            writer.close()
        await asyncio.gather(*handlers)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._open[writer] = task
        index = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = re.search(rb"Content-Length: (\d+)", head)
                body = await reader.readexactly(int(match.group(1)) if match else 0)
                self.requests.append(head + body)
                reply = Reply(writer, index, len(self.replies))
                self.replies.append(reply)
                keep = await self.respond(reply)
                index += 1
                if not keep or b"Connection: close" in head:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._open.pop(writer, None)
            writer.close()


@asynccontextmanager
async def paced_upstream() -> AsyncIterator[int]:
    """The benchmark's paced SSE upstream in this loop, on a free loopback port; the port."""
    server = await asyncio.get_running_loop().create_server(UpstreamProtocol, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@contextmanager
def text_server(pages: dict[str, str]) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 answering GET PATH with pages[PATH] (else 404); its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = pages.get(self.path)
            self.send_response(200 if text is not None else 404)
            self.end_headers()
            self.wfile.write((text or "").encode())

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def built_result(partial: bool = False, choices: bool = False):  # noqa: ANN201 - compare.BenchResult
    """A two-pool BenchResult from hand-built records: colocated's short streams stall when a long prompt
    lands (a 700 ms gap), P/D's do not; one colocated request failed; server figures as a source gives.
    `choices`: the colocated pool ran as round_robin (that run) and as prefix_load (no stall; every
    request on instance 0 by the gateway's header, so all four short streams overlapped the long one)."""
    from pdfleet.bench.client import Record
    from pdfleet.bench.compare import BenchPlan, BenchResult, PoolResult, PoolTarget
    from pdfleet.bench.load import PoolRun
    from pdfleet.bench.stats import Bounds
    from pdfleet.bench.workloads import Item, WorkloadSpec

    def rec(i: int, pool: str, cls: str, start: float, chunks: list[float], error: str = "") -> Record:
        r = Record(
            i,
            pool,
            cls,
            30000 if cls == "long" else 500,
            len(chunks),
            due=start,
            start=start,
            chunks=chunks,
            output_tokens=len(chunks) if not error else None,
            status=200,
            error=error,
        )
        r.ttft = chunks[0] - start if chunks else float("nan")
        return r

    def pool(name: str, stall: float) -> PoolResult:
        recs = [rec(0, name, "long", 1.0, [1.9, 1.91, 1.92])]
        for i in range(1, 5):
            ticks = [0.1 * i + 0.05 + 0.02 * k for k in range(80)]  # 20 ms gaps, past the long prompt
            recs.append(rec(i, name, "short", 0.1 * i, [t + stall if t > 1.2 else t for t in ticks]))
        if name == "colocated":
            cut = "the connection closed mid-stream after 1 token event(s)"
            recs.append(rec(5, name, "short", 0.6, [0.7], error=cut))
        run = PoolRun(name, recs, 0.0, 3.0, 1.7e9, lateness=[0.0001, 0.0005], loop_lag=[0.0002])
        server = {
            "queue_p95_ms": {name if name == "colocated" else "prefill": 350.0},
            "prefill_p95_ms": {"*": "n/a: no observation"},
            "kv_transfer_p95_ms": {"decode": 12.0} if name == "disagg" else {},
            "prefix_cache_hit_pct": {name if name == "colocated" else "prefill": 37.5},
        }
        mix: dict[str, float] | str = (
            {"forced_header": 5.0}
            if name == "colocated"
            else "n/a: no series pdfleet_gateway_decisions_total in the window"
        )
        return PoolResult(PoolTarget(name, 2), run, server, {name: 0.4}, mix)

    plan = BenchPlan(WorkloadSpec("long-prompt-mix"), rate=2.0, num_prompts=6, bounds=Bounds(1000, 100, 500))
    items = [Item(i, "x", 500, 6) for i in range(6)]
    pools = {"colocated": pool("colocated", 0.7), "disagg": pool("disagg", 0.0)}
    result = BenchResult(plan, items, pools, partial)
    if choices:
        balanced = pool("colocated", 0.0)
        assert balanced.run is not None
        for r in balanced.run.records:
            r.instance = 0 if r.chunks else None
        result.choices = {"round_robin": pools["colocated"], "prefix_load": balanced}
    return result
