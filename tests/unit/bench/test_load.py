"""The load driver: open- and closed-loop windowed runs against the paced upstream on loopback (what is
started, recorded, measured), and one pool's run against a scripted gateway (every request ends as a
record, a mid-run failure counted, open-loop starts keep their due times, fixed concurrency holds C in
flight, Ctrl-C cancels cleanly, a pool that answers no warm-up is PoolDown naming it)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
from pathlib import Path

import pytest

from pdfleet.bench.client import Record, StreamClient, request_bytes
from pdfleet.bench.load import (
    REFUSED_PAUSE_S,
    Gateway,
    LoadRun,
    PoolDown,
    Schedule,
    gateway_request,
    run_closed,
    run_open,
    run_pool,
    warm_up,
)
from pdfleet.bench.procs import free_port
from pdfleet.bench.upstream import paced_body
from pdfleet.bench.workloads import Item
from pdfleet.lab import pki
from tests.unit.bench.helpers import DONE, SSE_HEAD, Reply, ScriptedServer, chunk, paced_upstream
from tests.unit.gateway.helpers import USER_KEY, Env

PATH = "/v1/chat/completions"


def _client(port: int, body: bytes) -> tuple[StreamClient, bytes]:
    """A kept-alive client reading no payload (as the gateway bench drives it) and its request."""
    return StreamClient("127.0.0.1", port, parse=False), request_bytes("127.0.0.1", port, PATH, body)


def test_open_loop_starts_every_scheduled_stream_never_early() -> None:
    """A stream per start; TTFT only for those due in the window; lateness >= 0 for each; all drained.

    The window [0.3, 0.8) s holds the whole of the two streams due at 0.5 and 0.55 (3 events and
    [DONE] each, a few ms long) and nothing of the two due at 0 and 0.01: exactly 8 events, 2 done.
    """
    probe_calls: list[int] = []

    def probe() -> dict[str, float]:
        probe_calls.append(1)
        return {"answer": 42.0 * len(probe_calls)}

    async def main() -> LoadRun:
        async with paced_upstream() as port:
            starts = [0.0, 0.01, 0.5, 0.55]
            client, request = _client(port, paced_body(3, 1.0, 2.0))
            return await run_open(client, request, starts, 0.5, 0.3, 5.0, probe)

    run = asyncio.run(main())
    assert len(run.records) == 4 and len(run.lateness) == 4
    assert all(late >= 0.0 for late in run.lateness)
    assert len(run.stats.ttft) == 2  # due at 0.5 and 0.55, not before the 0.3 s warm-up
    assert (run.stats.done, run.stats.failed, run.unfinished) == (4, 0, 0)
    assert run.stats.events == 16 and all(len(r.chunks) == 3 for r in run.records)
    assert all(not math.isnan(r.end) for r in run.records)
    assert (run.before["answer"], run.after["answer"]) == (42.0, 84.0)
    window = run.window()
    assert window["t"] == window["t1"] - window["t0"] > 0
    assert window["answer"] == 42.0
    assert (window["events"], window["done"]) == (8, 2)


def test_open_loop_abandons_what_is_still_running_after_the_drain() -> None:
    """A 1 s stream and a 0.05 s drain: abandoned, counted unfinished, its record never ends."""

    async def main() -> LoadRun:
        async with paced_upstream() as port:
            client, request = _client(port, paced_body(50, 1.0, 20.0))
            return await run_open(client, request, [0.0], 0.01, 0.0, 0.05)

    run = asyncio.run(main())
    assert (run.unfinished, run.stats.done) == (1, 0)
    assert math.isnan(run.records[0].end)


def test_closed_loop_workers_each_keep_their_connection_and_finish_their_last_stream() -> None:
    """Three workers, back to back on kept-alive connections: three connections, every record ended.

    Each stream is 2 events and [DONE], so the client counts 3 events per stream; the window counts
    exactly the streams that ended in it, and the events of at least the streams wholly inside it and
    at most those that overlap it.
    """

    async def main() -> LoadRun:
        async with paced_upstream() as port:
            client, request = _client(port, paced_body(2, 1.0, 1.0))
            # a 2 s window, not 0.5 s: a process niced beside the lab can be starved through half a second,
            # and then read both of the window's ends in one loop turn with no stream ended between them
            return await run_closed(client, request, [0.0, 0.01, 0.02], 2.0, 0.2)

    run = asyncio.run(main())
    assert run.stats.connects == 3
    assert len(run.records) >= 3 and run.stats.done == len(run.records) and run.stats.failed == 0
    assert all(not math.isnan(r.end) for r in run.records)
    assert len(run.stats.ttft) < len(run.records)  # streams started in the warm-up are not recorded
    assert run.lateness == [] and run.unfinished == 0
    assert run.stats.events == 3 * len(run.records)
    window = run.window()
    ended = sum(1 for r in run.records if window["t0"] < r.end <= window["t1"])
    inside = sum(1 for r in run.records if window["t0"] < r.start and r.end <= window["t1"])
    overlapping = sum(1 for r in run.records if r.start < window["t1"] and r.end > window["t0"])
    assert window["done"] == ended > 0
    assert 3 * inside <= window["events"] <= 3 * overlapping


ITEMS = [Item(i, f"prompt {i}", 10 if i != 3 else 9000, 3) for i in range(6)]


def ev(text: str) -> bytes:
    return chunk(b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n")


def usage(n: int) -> bytes:
    return chunk(b'data: {"choices":[],"usage":{"completion_tokens":%d}}\n\n' % n)


def prompt_of(server: ScriptedServer, reply: Reply) -> str:
    return json.loads(server.requests[reply.number].split(b"\r\n\r\n", 1)[1])["prompt"]


async def _run(
    schedule: Schedule,
    fail_prompt: str | None = None,
    stop_after: float | None = None,
    delay: float = 0.02,
    forced: bool = True,
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
            forced=forced,
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
    # the rest due at 60 s: a run that waits for them stands out from one starved for seconds by the lab
    starts = [0.0, 0.0, 60.0, 60.0, 60.0, 60.0]
    run, _, _ = asyncio.run(_run(Schedule(starts=starts), stop_after=0.01, delay=1.0))
    assert run.interrupted
    assert len(run.records) == 2 and all(
        r.cancelled and r.error == "interrupted (Ctrl-C)" for r in run.records
    )
    assert run.wall_s < 30.0


def test_a_pool_that_answers_no_warm_up_is_pool_down_naming_it() -> None:
    async def respond(reply: Reply) -> bool:
        body = b'{"error":{"message":"no healthy upstream"}}'
        await reply.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        return True

    async def main() -> None:
        async with ScriptedServer(respond) as server:
            client = StreamClient("127.0.0.1", server.port)
            try:
                await warm_up(client, Gateway("127.0.0.1", server.port, "sk", "m"), "disagg", ITEMS, 2)
            finally:
                client.close()

    with pytest.raises(
        PoolDown,
        match=re.escape("pool disagg is down: every warm-up request") + ".*HTTP 503: no healthy upstream",
    ):
        asyncio.run(main())


def test_a_closed_loop_worker_pauses_after_a_refused_connection() -> None:
    """Nothing listening: one worker over 3 s sends a request per REFUSED_PAUSE_S (not thousands): it
    keeps trying, and each try starts at least REFUSED_PAUSE_S after the last one was refused (a busy
    machine only spreads them out; 3 s, not 0.3: niced beside the lab, this process can be starved long
    enough that a 0.3 s run made one try)."""
    port = free_port()

    async def main() -> LoadRun:
        client, request = _client(port, b"{}")
        return await run_closed(client, request, [0.0], 3.0, 0.0)

    run = asyncio.run(main())
    assert run.stats.failed == len(run.records) and run.stats.connects == 0
    assert 2 <= len(run.records) <= 3.0 / REFUSED_PAUSE_S + 2
    assert all(r.error.startswith(f"cannot connect to 127.0.0.1:{port}") for r in run.records)
    pauses = [b.start - a.end for a, b in itertools.pairwise(run.records)]
    assert min(pauses) >= REFUSED_PAUSE_S - 0.001, pauses  # the loop's timers may fire 1 clock tick early


def test_a_sessions_requests_carry_its_id_as_the_gateways_sticky_key() -> None:
    gw = Gateway("127.0.0.1", 8080, "sk", "m")
    head = gateway_request(gw, "colocated", "hi", 4, "agent-3").split(b"\r\n\r\n")[0]
    assert b"\r\nX-Session-Id: agent-3" in head and b"X-Pdfleet-Pool: colocated" in head
    assert b"X-Session-Id" not in gateway_request(gw, "colocated", "hi", 4)


def test_a_request_asks_for_the_deciders_settings_in_their_headers() -> None:
    gw = Gateway("127.0.0.1", 8080, "sk", "m")
    head = gateway_request(gw, None, "hi", 4, None, "prefix_load", "effective").split(b"\r\n\r\n")[0]
    assert b"\r\nX-Pdfleet-Colocated-Choice: prefix_load" in head
    assert b"\r\nX-Pdfleet-Threshold-On: effective" in head and b"X-Pdfleet-Pool" not in head
    assert b"X-Pdfleet-Threshold-On" not in gateway_request(gw, None, "hi", 4)


def test_an_unforced_run_leaves_the_pool_to_the_gateway() -> None:
    """Every request of an unforced run (the shadow A/B's) goes without the pool header, the first
    prebuilt ones too; a forced run's all carry it."""
    for forced in (False, True):
        run, _, server = asyncio.run(_run(Schedule(starts=[0.0] * 6), forced=forced))
        assert len(server.requests) >= 6 and all(r.success for r in run.records)
        assert all((b"X-Pdfleet-Pool: colocated" in raw) is forced for raw in server.requests), forced


@pytest.mark.procs  # openssl makes the CA and the gateway's certificate
def test_a_tls_gateway_is_reached_verifying_its_ca_and_refused_with_another(tmp_path: Path) -> None:
    """The bench's client to a real gateway on HTTPS: with the topology's CA it streams; a client holding
    another CA records the failed verification as the request's error (no exception)."""
    ca = pki.make_ca(tmp_path / "ca")
    other = pki.make_ca(tmp_path / "other")
    pair = pki.issue(ca, tmp_path / "ca", "gateway", ["localhost"], ["127.0.0.1"])
    listen = {"host": "127.0.0.1", "port": 0, "tls": {"cert_file": str(pair.cert), "key_file": str(pair.key)}}

    async def scenario() -> tuple[Record, Record]:
        async with Env(tmp_path, listen=listen) as env:
            assert env.gw is not None
            recs = []
            for trusted in (ca, other):
                gw = Gateway("127.0.0.1", env.gw.port, USER_KEY, "llama", str(trusted.cert))
                client, rec = gw.client(), Record()
                await client.run(gateway_request(gw, "colocated", "hello", 4), rec)
                client.close()
                recs.append(rec)
            return recs[0], recs[1]

    good, bad = asyncio.run(scenario())
    assert good.success and good.status == 200 and good.ttft > 0, good.error
    assert not bad.success and "CERTIFICATE_VERIFY_FAILED" in bad.error
