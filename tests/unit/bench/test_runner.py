"""One pool's run against a scripted gateway: every request ends as a record (a mid-run failure counted),
open-loop starts keep their due times, fixed concurrency holds C in flight, Ctrl-C cancels cleanly, and a
pool that answers no warm-up is PoolDown naming it."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from pdfleet.bench.openai_stream import StreamingClient
from pdfleet.bench.runner import Gateway, PoolDown, Schedule, run_pool, warm_up
from pdfleet.bench.workloads import Item
from tests.unit.bench.helpers import DONE, SSE_HEAD, Reply, ScriptedServer, chunk

ITEMS = [Item(i, f"prompt {i}", 10 if i != 3 else 9000, 3) for i in range(6)]


def ev(text: str) -> bytes:
    return chunk(b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n")


def usage(n: int) -> bytes:
    return chunk(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % n)


def prompt_of(server: ScriptedServer, reply: Reply) -> str:
    return json.loads(server.requests[reply.number].split(b"\r\n\r\n", 1)[1])["prompt"]


async def _run(
    schedule: Schedule, fail_prompt: str | None = None, stop_after: float | None = None, delay: float = 0.02
):  # noqa: ANN202
    server_ref: list[ScriptedServer] = []

    async def respond(reply: Reply) -> bool:
        prompt = prompt_of(server_ref[0], reply)
        await reply.write(SSE_HEAD + ev("a"))
        await asyncio.sleep(delay)
        if prompt == fail_prompt:
            return False  # cut mid-stream
        await reply.write(ev("b") + ev("c") + usage(3) + DONE)
        return True

    async with ScriptedServer(respond) as server:
        server_ref.append(server)
        stop = asyncio.Event()
        if stop_after is not None:
            asyncio.get_running_loop().call_later(stop_after, stop.set)
        seen: list[tuple[int, int | None]] = []
        run = await run_pool(
            Gateway("127.0.0.1", server.port, "sk", "m"),
            "colocated",
            ITEMS,
            schedule,
            8192,
            stop,
            lambda d, t: seen.append((d, t)),
        )
        return run, seen, server


def test_open_loop_every_request_is_a_record_and_a_mid_run_failure_is_counted() -> None:
    starts = [0.0, 0.02, 0.04, 0.06, 0.08, 0.10]
    run, seen, _ = asyncio.run(_run(Schedule(starts=starts), fail_prompt="prompt 2"))
    assert sorted(r.index for r in run.records) == list(range(6))
    failed = [r for r in run.records if not r.success]
    assert [r.index for r in failed] == [2] and "mid-stream" in failed[0].error and not failed[0].cancelled
    assert [r.due for r in sorted(run.records, key=lambda r: r.index)] == starts
    assert len(run.lateness) == 6 and all(late >= 0 for late in run.lateness)
    assert seen[-1] == (6, 6) and not run.interrupted and run.loop_lag


def test_length_class_from_the_threshold() -> None:
    run, _, _ = asyncio.run(_run(Schedule(starts=[0.0] * 6)))
    by_index = {r.index: r.length_class for r in run.records}
    assert by_index[3] == "long" and by_index[0] == "short"


def test_fixed_concurrency_runs_num_prompts_with_at_most_c_in_flight() -> None:
    run, seen, server = asyncio.run(_run(Schedule(concurrency=2), delay=0.05))
    assert len(run.records) == 6 and all(r.success for r in run.records)
    spans = sorted((r.start, r.chunks[-1]) for r in run.records)
    for t, _ in spans:
        assert sum(1 for s, e in spans if s <= t < e) <= 2
    assert seen[-1] == (6, 6) and len({rep.index for rep in server.replies}) <= 3


def test_stop_cancels_requests_in_flight_and_marks_the_run_interrupted() -> None:
    run, _, _ = asyncio.run(_run(Schedule(starts=[0.0, 0.0, 5.0, 5.0, 5.0, 5.0]), stop_after=0.01, delay=1.0))
    assert run.interrupted
    assert len(run.records) == 2 and all(
        r.cancelled and r.error == "interrupted (Ctrl-C)" for r in run.records
    )
    assert run.wall_s < 2.0


def test_a_pool_that_answers_no_warm_up_is_pool_down_naming_it() -> None:
    async def respond(reply: Reply) -> bool:
        body = b'{"error":{"message":"no healthy upstream"}}'
        await reply.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return True

    async def main() -> None:
        async with ScriptedServer(respond) as server:
            client = StreamingClient("127.0.0.1", server.port)
            try:
                await warm_up(client, Gateway("127.0.0.1", server.port, "sk", "m"), "disagg", ITEMS, 2)
            finally:
                client.close()

    with pytest.raises(
        PoolDown,
        match=re.escape("pool disagg is down: every warm-up request") + ".*HTTP 503: no healthy upstream",
    ):
        asyncio.run(main())
