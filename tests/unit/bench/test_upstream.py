"""The paced upstream: the events asked for, keep-alive, a bad body refused, and its entry point."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from pdfleet.bench.client import Record, Stats, StreamClient, request_bytes
from pdfleet.bench.procs import free_port, stop_processes, wait_port
from pdfleet.bench.upstream import paced_body
from tests.unit.bench.helpers import paced_upstream

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

PATH = "/v1/chat/completions"


def _client(port: int, body: bytes, keepalive: bool = True) -> tuple[StreamClient, bytes]:
    """A client reading no payload (as the gateway bench drives the upstream) and its request."""
    request = request_bytes("127.0.0.1", port, PATH, body, keepalive=keepalive)
    return StreamClient("127.0.0.1", port, keepalive=keepalive, parse=False), request


def test_paced_body_asks_for_tokens_and_pacing() -> None:
    """A streaming chat request; `bench` carries the pacing the upstream reads."""
    body = json.loads(paced_body(64, 20.0, 25.0))
    assert (body["stream"], body["max_tokens"], body["bench"]) == (
        True,
        64,
        {"first_ms": 20.0, "gap_ms": 25.0},
    )


def test_the_upstream_streams_the_events_asked_for_on_one_kept_alive_connection() -> None:
    """Three streams of 5 events (plus [DONE]) each, one connection; paced: 1 ms, then 20 ms apart."""
    spans = [Record() for _ in range(3)]

    async def main() -> Stats:
        async with paced_upstream() as port:
            client, request = _client(port, paced_body(5, 1.0, 20.0))
            for span in spans:
                await client.run(request, span)
            client.close()
            return client.stats

    stats = asyncio.run(main())
    assert (stats.done, stats.failed, stats.events, stats.connects) == (3, 0, 18, 1)
    assert all(len(span.chunks) == 5 for span in spans)
    # the last event cannot come before the upstream's timers let it (a loaded machine only delays it)
    assert all(span.chunks[-1] - span.start >= 0.080 for span in spans)


def test_connection_close_is_honoured() -> None:
    """`Connection: close`: the upstream hangs up after the reply, the next stream reconnects."""

    async def main() -> Stats:
        async with paced_upstream() as port:
            client, request = _client(port, paced_body(2, 1.0, 1.0), keepalive=False)
            for _ in range(2):
                await client.run(request, Record())
            client.close()
            return client.stats

    stats = asyncio.run(main())
    assert (stats.done, stats.connects) == (2, 2)


def test_a_body_that_is_not_json_gets_400() -> None:
    """A bad request is refused, not streamed."""

    async def main() -> Stats:
        async with paced_upstream() as port:
            client, request = _client(port, b"not json")
            await client.run(request, Record())
            client.close()
            return client.stats

    stats = asyncio.run(main())
    assert (stats.done, stats.failed, stats.events) == (0, 1, 0)


def test_python_m_pdfleet_bench_upstream_serves_on_the_given_port() -> None:
    """The entry point the benchmark starts: `python -m pdfleet.bench.upstream --port P`."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.bench.upstream", "--port", str(port)], stdout=subprocess.DEVNULL
    )
    try:
        wait_port(port, timeout=20.0, proc=proc)

        async def main() -> Stats:
            client, request = _client(port, paced_body(3, 1.0, 1.0))
            await client.run(request, Record())
            client.close()
            return client.stats

        stats = asyncio.run(main())
        assert (stats.done, stats.events) == (1, 4)
    finally:
        stop_processes([proc])
