"""The benchmarks' load driver: requests started by an arrival schedule (open loop) or workers (closed loop).

Open loop (`open_loop`): a request starts at each due time, however many are in flight then, as
independent clients arrive; each start's lateness (began vs due) shows whether the client kept up.
Closed loop (`closed_loop`): workers each run one request after another (`vllm bench serve
--max-concurrency`). Two ways to use them: `run_open` / `run_closed` send one request over and over
and difference counters over a measured window [warmup, warmup + duration) (the simulator and gateway
benches); `run_pool` runs a workload's items through the gateway to one pool, every request a Record,
the event loop's lag sampled beside it, a stop event (Ctrl-C) ending it early (`invoke bench`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.bench.client import Record, Stats, StreamClient, request_bytes
from pdfleet.bench.workloads import Item, completion_body
from pdfleet.errors import PdfleetError
from pdfleet.gateway.policy import length_class  # the gateway's own rule: records classed as it routes
from pdfleet.gateway.tls import client_context
from pdfleet.model.routing import CHOICE_HEADER, THRESHOLD_HEADER

Probe = Callable[[], dict[str, float]]  # counters to difference over the window (e.g. CPU seconds)
Progress = Callable[[int, int | None], None]  # (requests finished, total or None when open-ended)
LAG_TICK_S = 0.005
SPIN_S = 0.002  # the last stretch before a scheduled start, waited by yielding rather than by a timer
REFUSED_PAUSE_S = 0.05  # closed loop: a worker whose request never reached the server waits this long
PREBUILT = 20000  # requests encoded before the run (the rest, if any, as they start)


async def open_loop(
    starts: Sequence[float],
    launch: Callable[[int, float], Coroutine[Any, Any, object]],
    tasks: set[asyncio.Task[Any]],
    base: float,
    stop: asyncio.Event,
) -> None:
    """Start `launch(i, due)` as a task at each due time (s after `base`), never early, until done or stop."""
    for i, due in enumerate(starts):
        # A timer wakes the loop up to ~1.5 ms late at P99 even when idle (kernel and VM wake-up, uvloop's
        # 1 ms timers): sleep until SPIN_S before the due time, then yield to the loop until due. The
        # loop keeps serving the streams meanwhile; the cost is CPU, not lateness.
        while (left := due - (time.perf_counter() - base)) > 0:
            if stop.is_set():
                return
            await asyncio.sleep(min(left - SPIN_S, 0.25) if left > SPIN_S else 0)
        if stop.is_set():
            return
        task = asyncio.create_task(launch(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def closed_loop(
    offsets: Sequence[float],
    one: Callable[[int], Awaitable[Record]],
    more: Callable[[int], bool],
    tasks: set[asyncio.Task[Any]],
    stop: asyncio.Event,
) -> None:
    """One worker per offset, each starting there and running `one(i)` after another while `more(i)`
    holds (i counts the requests started by all workers); returns when every worker ends or on `stop`."""
    counter = itertools.count()

    async def worker(offset: float) -> None:
        """One closed-loop worker."""
        if offset:
            await asyncio.sleep(offset)
        while not stop.is_set() and more(i := next(counter)):
            rec = await one(i)
            if rec.error and not rec.status:  # refused: do not spin on a server that is not there
                await asyncio.sleep(REFUSED_PAUSE_S)

    workers = [asyncio.create_task(worker(o)) for o in offsets]
    for w in workers:
        tasks.add(w)
        w.add_done_callback(tasks.discard)
    stopper = asyncio.create_task(stop.wait())
    while not stop.is_set() and any(not w.done() for w in workers):
        await asyncio.wait({*workers, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()


async def drain(tasks: set[asyncio.Task[Any]], stop: asyncio.Event, drain_s: float) -> None:
    """Wait for the requests in flight, at most drain_s, unless the run is stopped."""
    if not tasks or stop.is_set():
        return
    stopper = asyncio.create_task(stop.wait())
    deadline = time.perf_counter() + drain_s
    while tasks and not stop.is_set() and (left := deadline - time.perf_counter()) > 0:
        await asyncio.wait({*tasks, stopper}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()


@dataclass
class LoadRun:
    """What one windowed run observed: the client's stats, counters at the window's ends, every request."""

    stats: Stats
    before: dict[
        str, float
    ]  # at the measured window's start: "t" (perf_counter s), "events", "done", probe's
    after: dict[str, float]  # the same at its end
    records: list[Record] = field(default_factory=list)
    lateness: list[float] = field(default_factory=list)  # open loop: began - due of each started stream, s
    unfinished: int = 0  # open loop: streams still running after the drain (abandoned)

    def window(self) -> dict[str, float]:
        """Every counter's change over the window, plus its start and end times "t0" and "t1"."""
        out = {k: self.after[k] - v for k, v in self.before.items()}
        out["t0"], out["t1"] = self.before["t"], self.after["t"]
        return out


async def measure(
    stats: Stats, probe: Probe | None, warmup: float, duration: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Counters after `warmup` s and again `duration` s later."""

    def read() -> dict[str, float]:
        return {
            "t": time.perf_counter(),
            "events": stats.events,
            "done": stats.done,
            **(probe() if probe else {}),
        }

    await asyncio.sleep(warmup)
    start = read()
    await asyncio.sleep(duration)
    return start, read()


async def run_closed(
    client: StreamClient,
    request: bytes,
    offsets: Sequence[float],
    duration: float,
    warmup: float,
    probe: Probe | None = None,
) -> LoadRun:
    """Closed-loop load: one worker per offset, each starting there and sending `request` over and over.

    Workers start no request after the window ends and finish the one they run; TTFT is recorded for
    requests started after `warmup`. The client is closed when this returns.
    """
    t_start = time.perf_counter()
    record_after, deadline = t_start + warmup, t_start + warmup + duration
    records: list[Record] = []

    async def one(_: int) -> Record:
        rec = Record()
        records.append(rec)
        await client.run(request, rec, time.perf_counter() >= record_after)
        return rec

    window = asyncio.ensure_future(measure(client.stats, probe, warmup, duration))
    await closed_loop(offsets, one, lambda _: time.perf_counter() < deadline, set(), asyncio.Event())
    client.close()
    before, after = await window
    return LoadRun(client.stats, before, after, records)


async def run_open(
    client: StreamClient,
    request: bytes,
    starts: Sequence[float],
    duration: float,
    warmup: float,
    drain_s: float,
    probe: Probe | None = None,
) -> LoadRun:
    """Open-loop load: `request` starts at each of `starts` (s from now), however many are in flight then.

    TTFT is recorded for requests due in the measured window. After the last start, those in flight get
    at most `drain_s` s to finish; any still running are abandoned and counted unfinished (their `end`
    stays NaN). The client is closed when this returns.
    """
    records: list[Record] = []
    lateness: list[float] = []
    tasks: set[asyncio.Task[Any]] = set()

    async def one(_: int, due: float) -> None:
        rec = Record(due=due)
        records.append(rec)
        lateness.append(time.perf_counter() - base - due)
        await client.run(request, rec, due >= warmup)

    stop = asyncio.Event()
    base = time.perf_counter()
    window = asyncio.ensure_future(measure(client.stats, probe, warmup, duration))
    await open_loop(starts, one, tasks, base, stop)
    before, after = await window
    await drain(tasks, stop, drain_s)
    unfinished = len(tasks)
    await _cancel(tasks)
    client.close()
    return LoadRun(client.stats, before, after, records, lateness, unfinished)


async def _cancel(tasks: set[asyncio.Task[Any]]) -> None:
    """Cancel the tasks still running and wait until they are gone."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class PoolDown(PdfleetError):
    """A pool that answered none of the warm-up requests: the message names it and says what happened."""


@dataclass(frozen=True)
class Schedule:
    """How requests start: `starts` (s, open loop, wall time) or `concurrency` workers; and when to stop."""

    starts: Sequence[float] | None = None
    concurrency: int | None = None
    duration_s: float | None = None  # concurrency mode: start no request after this many wall seconds
    drain_s: float = 600.0  # after the last start, how long requests in flight may still run


@dataclass(frozen=True)
class Gateway:
    """Where the client sends requests: the gateway's address, its client key, the model alias, and for a
    TLS gateway the CA its certificate is verified against (the topology's gateway.ca_file)."""

    host: str
    port: int
    key: str | None
    model: str
    ca_file: str | None = None

    def client(self) -> StreamClient:
        """A kept-alive stream client to this gateway, over HTTPS verifying its CA when it has one."""
        return StreamClient(self.host, self.port, tls=client_context(self.ca_file))


@dataclass
class PoolRun:
    """What one pool's run observed."""

    pool: str
    records: list[Record]
    t0: float  # perf_counter when the schedule began
    t1: float  # when the last request ended (or the run stopped)
    unix_start: float
    lateness: list[float] = field(default_factory=list)  # open loop: began - due, s
    loop_lag: list[float] = field(default_factory=list)  # event-loop overshoot of a 5 ms sleep, s
    interrupted: bool = False
    samples: dict[str, float | str] = field(default_factory=dict)  # the background sampler's (peak KV)

    @property
    def wall_s(self) -> float:
        """The run's length in wall seconds (first due to last end)."""
        return self.t1 - self.t0


def gateway_request(
    gw: Gateway,
    pool: str | None,
    prompt: str,
    max_tokens: int,
    session: str | None = None,
    choice: str | None = None,
    on: str | None = None,
) -> bytes:
    """A streaming /v1/completions request through the gateway to `pool` (None: where the gateway
    decides) with usage in the stream; a session's id as X-Session-Id (the gateway's sticky key); a
    colocated choice and a threshold_on in the gateway's choice and threshold headers (None: its own)."""
    body = completion_body(prompt, max_tokens, gw.model, usage=True)
    headers = {"X-Session-Id": session} if session else {}
    if choice:
        headers[CHOICE_HEADER] = choice
    if on:
        headers[THRESHOLD_HEADER] = on
    return request_bytes(gw.host, gw.port, "/v1/completions", body, key=gw.key, pool=pool, headers=headers)


async def warm_up(
    client: StreamClient, gw: Gateway, pool: str, items: Sequence[Item], count: int, forced: bool = True
) -> None:
    """`count` short requests (not recorded) so connections, caches and the router are warm (not `forced`:
    no pool header, where the gateway decides); PoolDown when every one of them fails (the error names the
    pool and the first failure)."""
    if count <= 0:
        return
    recs = [Record(-1, pool, "warmup", 0, 4) for _ in range(count)]
    prompts = [it.prompt for it in sorted(items, key=lambda it: it.prompt_tokens)[:count]] or ["warm up"]
    header = pool if forced else None
    requests = [gateway_request(gw, header, prompts[i % len(prompts)][:2000], 4) for i in range(count)]
    await asyncio.gather(*(client.run(req, rec, False) for req, rec in zip(requests, recs, strict=True)))
    if all(r.error for r in recs):
        raise PoolDown(
            f"pool {pool} is down: every warm-up request through the gateway at "
            f"{gw.host}:{gw.port} failed; the first: {recs[0].error}"
        )


async def _lag_monitor(out: list[float], stop: asyncio.Event) -> None:
    """Sample how late a 5 ms sleep wakes up: the event loop's own lag."""
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(LAG_TICK_S)
        out.append(max(0.0, time.perf_counter() - t - LAG_TICK_S))


async def run_pool(
    gw: Gateway,
    pool: str,
    items: Sequence[Item],
    schedule: Schedule,
    long_tokens: int,
    stop: asyncio.Event,
    progress: Progress | None = None,
    background: Callable[[asyncio.Event], Coroutine[Any, Any, dict[str, float | str]]] | None = None,
    choice: str | None = None,
    forced: bool = True,
    on: str | None = None,
) -> PoolRun:
    """Run `items` through the gateway to `pool` by `schedule`; every request ends as a Record. `choice`,
    `on`: the colocated choice and threshold_on every request asks the gateway for (None: the gateway's
    own); not `forced`: no pool header, the gateway's live stage decides (the records still say `pool`).

    Requests cancelled by `stop` or abandoned after the drain are marked cancelled, with the reason.
    """
    client = gw.client()
    header = pool if forced else None
    records: list[Record] = []
    ended: set[int] = set()  # id() of the records whose request ended (the others were cancelled)
    lateness: list[float] = []
    lag: list[float] = []
    finished, sampler_stop = asyncio.Event(), asyncio.Event()
    tasks: set[asyncio.Task[Any]] = set()
    total = len(items) if schedule.starts is not None or schedule.duration_s is None else None

    async def one(i: int, due: float | None = None) -> Record:
        """Run the i-th item (cycling through them), recording its lateness when it had a due time."""
        item = items[i % len(items)]
        cls = length_class(item.prompt_tokens, long_tokens)
        rec = Record(item.index, pool, cls, item.prompt_tokens, item.output_tokens)
        records.append(rec)
        request = requests.get(item.index) or gateway_request(
            gw, header, item.prompt, item.output_tokens, item.session, choice, on
        )
        if due is not None:
            rec.due = due
            lateness.append(time.perf_counter() - base - due)  # at the start: a cancelled request counts too
        await client.run(request, rec)
        ended.add(id(rec))
        if progress:
            progress(len(ended), total)
        return rec

    # built before the clock starts: encoding a 30K-token prompt takes a millisecond the schedule cannot spare
    requests = {
        it.index: gateway_request(gw, header, it.prompt, it.output_tokens, it.session, choice, on)
        for it in items[:PREBUILT]
    }
    lag_task = asyncio.create_task(_lag_monitor(lag, finished))
    sampler = asyncio.create_task(background(sampler_stop)) if background else None
    base, unix = time.perf_counter(), time.time()
    try:
        if schedule.starts is not None:
            await open_loop(schedule.starts[: len(items)], one, tasks, base, stop)
        else:
            deadline = None if schedule.duration_s is None else base + schedule.duration_s
            limit = len(items) if deadline is None else None

            def more(i: int) -> bool:
                """Items left (a count) or time left (a duration)."""
                return (limit is None or i < limit) and (deadline is None or time.perf_counter() < deadline)

            await closed_loop([0.0] * max(1, schedule.concurrency or 1), one, more, tasks, stop)
        await drain(tasks, stop, schedule.drain_s)
    finally:
        await _cancel(tasks)
        t1 = time.perf_counter()
        for rec in records:
            if id(rec) not in ended:
                rec.cancelled = True
                rec.error = (
                    "interrupted (Ctrl-C)" if stop.is_set() else "abandoned: still running after the drain"
                )
        finished.set()
        sampler_stop.set()
        samples = await sampler if sampler else {}
        await lag_task
        client.close()
    return PoolRun(pool, records, base, t1, unix, lateness, lag, stop.is_set(), samples)
