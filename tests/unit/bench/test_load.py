"""Open- and closed-loop runs against the paced upstream on loopback: what is started, recorded, measured."""

from __future__ import annotations

import asyncio
import math

from pdfleet.bench.client import Stats, StreamClient, request_bytes
from pdfleet.bench.load import LoadRun, run_closed, run_open
from pdfleet.bench.upstream import paced_body
from tests.unit.bench.helpers import paced_upstream

PATH = "/v1/chat/completions"


def _client(port: int, body: bytes) -> StreamClient:
    return StreamClient(port, request_bytes(port, PATH, body, keepalive=True), Stats(), True)


def test_open_loop_starts_every_scheduled_stream_never_early() -> None:
    """A stream per start; TTFT only for those due in the window; lateness >= 0 for each; all drained."""
    probe_calls: list[int] = []

    def probe() -> dict[str, float]:
        probe_calls.append(1)
        return {"answer": 42.0 * len(probe_calls)}

    async def main() -> LoadRun:
        async with paced_upstream() as port:
            starts = [0.0, 0.01, 0.05, 0.08]
            return await run_open(_client(port, paced_body(3, 1.0, 2.0)), starts, 0.05, 0.04, 5.0, probe)

    run = asyncio.run(main())
    assert len(run.spans) == 4 and len(run.lateness) == 4
    assert all(late >= 0.0 for late in run.lateness)
    assert len(run.stats.ttft) == 2  # due at 0.05 and 0.08, not before the 0.04 s warm-up
    assert (run.stats.done, run.stats.failed, run.unfinished) == (4, 0, 0)
    assert all(not math.isnan(s.end) for s in run.spans)
    assert (run.before["answer"], run.after["answer"]) == (42.0, 84.0)
    window = run.window()
    assert window["t"] == window["t1"] - window["t0"] > 0
    assert window["answer"] == 42.0
    assert {"events", "done"} <= window.keys()


def test_open_loop_abandons_what_is_still_running_after_the_drain() -> None:
    """A 1 s stream and a 0.05 s drain: abandoned, counted unfinished, its span never ends."""

    async def main() -> LoadRun:
        async with paced_upstream() as port:
            return await run_open(_client(port, paced_body(50, 1.0, 20.0)), [0.0], 0.01, 0.0, 0.05)

    run = asyncio.run(main())
    assert (run.unfinished, run.stats.done) == (1, 0)
    assert math.isnan(run.spans[0].end)


def test_closed_loop_workers_each_keep_their_connection_and_finish_their_last_stream() -> None:
    """Three workers, back to back on kept-alive connections: three connections, every span ended."""

    async def main() -> LoadRun:
        async with paced_upstream() as port:
            return await run_closed(_client(port, paced_body(2, 1.0, 1.0)), [0.0, 0.01, 0.02], 0.5, 0.05)

    run = asyncio.run(main())
    assert run.stats.connects == 3
    assert len(run.spans) >= 3 and run.stats.done == len(run.spans) and run.stats.failed == 0
    assert all(not math.isnan(s.end) for s in run.spans)
    assert len(run.stats.ttft) < len(run.spans)  # streams started in the warm-up are not recorded
    assert run.lateness == [] and run.unfinished == 0
    assert run.after["events"] - run.before["events"] >= 0
