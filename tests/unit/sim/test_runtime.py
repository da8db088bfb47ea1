"""The step loop in real (scaled) time, without HTTP: tokens written to sinks, settlement, metrics, stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.engine import SimRequest
from pdfleet.sim.runtime import Runtime
from pdfleet.sim.stream import Sink
from tests.unit.sim.helpers import MODEL, FakeTransport, chunk_events

FAST = ["--sim-time-scale", "0.01", "--disable-log-stats"]


def _run(args: list[str], body: Callable[[Runtime], Awaitable[Any]]) -> Any:
    """Open and start a Runtime for `args`, run `body` with it, stop it."""

    async def main() -> Any:
        runtime = Runtime(parse_serve_args([MODEL, *args], env={}))
        await runtime.open()
        runtime.start()
        try:
            return await asyncio.wait_for(body(runtime), 10)
        finally:
            await runtime.stop()

    return asyncio.run(main())


def _request(kind: str, max_tokens: int, transport: FakeTransport | None) -> SimRequest:
    sink = Sink(kind, f"{kind}-1", MODEL, transport is not None, False, asyncio.get_running_loop())
    sink.transport = transport  # type: ignore[assignment]
    return SimRequest(f"{kind}-1-1", 40, max_tokens, sink=sink)


def test_a_stream_gets_one_chunk_per_token_and_the_last_carries_the_finish_reason() -> None:
    transport = FakeTransport()

    async def body(runtime: Runtime) -> SimRequest:
        req = _request("completion", 3, transport)
        runtime.submit(req)
        await req.sink.done
        return req

    req = _run(FAST, body)
    events = [chunk_events(w) for w in transport.writes]
    assert [len(e) for e in events] == [1, 1, 1]
    choices = [e[0]["choices"][0] for e in events]
    assert [c["text"] for c in choices] == [" the", " quick", " brown"]
    assert [c["finish_reason"] for c in choices] == [None, None, "length"]
    assert req.generated == 3 and req.sink.error is None


def test_a_chat_stream_sends_the_role_event_in_the_first_tokens_chunk() -> None:
    transport = FakeTransport()

    async def body(runtime: Runtime) -> None:
        req = _request("chat", 2, transport)
        runtime.submit(req)
        await req.sink.done

    _run(FAST, body)
    first = chunk_events(transport.writes[0])
    assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first[1]["choices"][0]["delta"] == {"content": " the"}
    assert len(transport.writes) == 2


def test_finished_requests_are_measured_in_simulated_seconds() -> None:
    async def body(runtime: Runtime) -> Runtime:
        req = _request("completion", 4, None)  # not streamed: settled once, at the end
        runtime.submit(req)
        await req.sink.done
        return runtime

    runtime = _run(FAST, body)
    m = runtime.metrics
    assert (m.ttft.n, m.itl.n, m.e2e.n, m.tpot.n) == (1, 3, 1, 1)
    assert m.success["length"] == 1
    decode_step = runtime.engine.perf.decode_time(1, 42)
    # simulated gaps: a step's duration, whatever the wall clock did (time scale 0.01)
    assert m.itl.total / m.itl.n == pytest.approx(decode_step, rel=0.05)
    assert m.steps >= 4 and m.busy_sim_s > 0


def test_a_client_that_went_away_aborts_its_request() -> None:
    async def body(runtime: Runtime) -> Runtime:
        req = _request("completion", 50, FakeTransport(closing=True))
        runtime.submit(req)
        await req.sink.done
        assert req.finish_reason == "abort" and req.generated == 1
        return runtime

    runtime = _run(FAST, body)
    assert runtime.metrics.success["abort"] == 1 and runtime.engine.num_running == 0


def test_stop_fails_what_is_in_flight() -> None:
    async def main() -> Sink:
        runtime = Runtime(parse_serve_args([MODEL, "--sim-time-scale", "1.0", "--disable-log-stats"], env={}))
        await runtime.open()
        runtime.start()
        req = _request("completion", 10_000, None)
        runtime.submit(req)
        await asyncio.sleep(0.05)
        await runtime.stop()
        return req.sink

    sink = asyncio.run(main())
    assert sink.done.done() and sink.error == "the server is shutting down"


def test_the_stats_loop_logs_vllms_engine_line(caplog: pytest.LogCaptureFixture) -> None:
    async def body(runtime: Runtime) -> None:
        req = _request("completion", 200, None)
        runtime.submit(req)
        await req.sink.done
        await runtime.clock.sleep(1.0)

    with caplog.at_level(logging.INFO, logger="pdfleet.sim"):
        _run(["--sim-time-scale", "0.01", "--sim-log-interval", "0.5"], body)
    assert any("Engine 000: Avg prompt throughput: " in r.getMessage() for r in caplog.records)
