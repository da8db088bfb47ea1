"""The step loop in real (scaled) time, without HTTP: tokens written to sinks, settlement, metrics, stop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from pdfleet.sim.config import parse_serve_args
from pdfleet.sim.engine import SimRequest
from pdfleet.sim.runtime import Runtime
from pdfleet.sim.stream import Sink
from tests.unit.sim.helpers import MODEL, FakeTransport, VirtualTimeLoop, chunk_events

FAST = ["--sim-time-scale", "0.01", "--disable-log-stats"]


def _run(args: list[str], body: Callable[[Runtime], Awaitable[Any]], virtual_time: bool = False) -> Any:
    """Open and start a Runtime for `args`, run `body` with it, stop it (on a VirtualTimeLoop: its loop
    time moves only when it waits)."""

    async def main() -> Any:
        runtime = Runtime(parse_serve_args([MODEL, *args], env={}))
        await runtime.open()
        runtime.start()
        try:
            return await asyncio.wait_for(body(runtime), 10)
        finally:
            await runtime.stop()

    with asyncio.Runner(loop_factory=VirtualTimeLoop if virtual_time else None) as runner:
        return runner.run(main())


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


def test_an_idle_engine_starts_at_the_arrival_not_when_the_request_was_ready() -> None:
    """Parsing and tokenizing took 0.2 simulated s after the first byte: the TTFT does not include them."""

    async def body(runtime: Runtime) -> float:
        await runtime.clock.sleep(0.5)
        req = _request("completion", 1, None)
        runtime.submit(req, arrival=runtime.clock.now() - 0.2)
        await req.sink.done
        assert req.first_scheduled == pytest.approx(req.arrival)
        return runtime.metrics.ttft.total

    prefill = Runtime(parse_serve_args([MODEL, *FAST], env={})).engine.perf.prefill_only_time(40)
    assert _run(["--sim-time-scale", "0.1", "--disable-log-stats"], body) == pytest.approx(prefill, rel=0.05)


def test_an_abort_is_counted_once_wherever_it_comes_from() -> None:
    async def body(runtime: Runtime) -> Runtime:
        req = _request("completion", 100_000, None)  # ~65 wall s at this scale: aborted long before
        runtime.submit(req)
        await runtime.clock.sleep(0.05)
        runtime.abort(req)  # the handler was cancelled
        runtime.abort(req)  # and the step loop saw the closed connection
        await req.sink.done
        return runtime

    runtime = _run(["--sim-time-scale", "0.1", "--disable-log-stats"], body)
    assert runtime.metrics.success["abort"] == 1 and runtime.engine.num_running == 0


def test_a_blocked_loop_is_measured_and_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    async def body(runtime: Runtime) -> Runtime:
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # something blocks the event loop
        await asyncio.sleep(0.2)
        time.sleep(0.3)  # again, within the warning interval: measured, not logged again
        await asyncio.sleep(0.2)
        return runtime

    with caplog.at_level(logging.WARNING, logger="pdfleet.sim"):
        runtime = _run(FAST, body)
    lag = runtime.metrics.loop_lag
    # at least the two blocks: niced beside the lab, this process can be starved past 0.25 s besides
    assert lag.count_above(0.25) >= 2 and lag.total >= 0.5
    warnings = [r.getMessage() for r in caplog.records if "behind schedule" in r.getMessage()]
    assert len(warnings) == 1 and "1 loop probes late by more than 100 ms" in warnings[0], warnings


# a ~6.5 ms decode step takes ~130 ms of loop time; these tests run on a VirtualTimeLoop, so a step's
# lateness is what the runtime scheduled (none), not what a loaded machine's scheduling adds
SCALE = 20
LATE = 1e-9  # loop s: a step "late" by float rounding alone
SLOW = ["--sim-time-scale", str(SCALE), "--disable-log-stats"]


async def _late_request(
    runtime: Runtime, transport: FakeTransport, intake_wall_s: float
) -> tuple[float, SimRequest]:
    """A stream decodes; just after one of its tokens, a request's first byte comes and its intake takes
    `intake_wall_s`; the request's arrival and the request once it is done."""
    stream = _request("completion", 40, transport)
    runtime.submit(stream)
    while len(transport.writes) < 3:
        await asyncio.sleep(0.001)
    arrival = runtime.clock.now()  # the next step has just been scheduled: the one after it is due
    loop = asyncio.get_running_loop()
    with runtime.arriving(arrival) as pending:
        await asyncio.sleep(intake_wall_s)  # the host reads, tokenizes and hashes
        req = SimRequest("late-1", 40, 1, sink=Sink("completion", "late", MODEL, False, False, loop))
        runtime.submit(req, arrival)
        pending.done()
    await req.sink.done
    await stream.sink.done
    return arrival, req


def test_a_busy_engine_takes_a_request_into_the_step_after_its_arrival_when_its_intake_fits() -> None:
    """The intake ends inside the next step's length: that step waits for it (the request joins it, as
    on a GPU) and no token of the stream comes late. Before, the request joined the step after."""
    step = Runtime(parse_serve_args([MODEL, *FAST], env={})).engine.perf.prefill_only_time(1)

    async def body(runtime: Runtime) -> tuple[float, SimRequest, float, int, float]:
        arrival, req = await _late_request(runtime, FakeTransport(), 1.4 * step * SCALE)
        m = runtime.metrics
        return arrival, req, m.intake_wait_s, m.intake_missed_steps, m.max_lag_s

    arrival, req, waited, missed, lag = _run(SLOW, body, virtual_time=True)
    assert req.first_scheduled is not None
    assert req.first_scheduled - arrival < 1.3 * step, (req.first_scheduled - arrival, step)
    assert waited > 0 and missed == 0
    assert lag < LATE, lag  # loop s: the stream's tokens kept their schedule


def test_an_intake_longer_than_a_step_joins_later_and_never_delays_the_other_streams() -> None:
    step = Runtime(parse_serve_args([MODEL, *FAST], env={})).engine.perf.prefill_only_time(1)

    async def body(runtime: Runtime) -> tuple[float, SimRequest, int, float]:
        arrival, req = await _late_request(runtime, FakeTransport(), 4 * step * SCALE)
        return arrival, req, runtime.metrics.intake_missed_steps, runtime.metrics.max_lag_s

    arrival, req, missed, lag = _run(SLOW, body, virtual_time=True)
    assert req.first_scheduled is not None and req.first_scheduled - arrival > 2 * step
    assert missed >= 2
    assert lag < LATE, lag
