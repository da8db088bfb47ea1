"""One pool's run: warm-up, then open-loop arrivals or a fixed concurrency, every request a Record.

Open loop: each request starts at its due time (gamma/Poisson arrivals, or a trace's own times),
however many are in flight; its lateness (began - due) says whether the client kept up. Fixed
concurrency: C workers each run one request after another (`vllm bench serve --max-concurrency` with
an infinite rate). Either way the event loop's own lag is sampled too. A stop event (Ctrl-C) ends the
run early: requests in flight are cancelled and marked so, and the run is marked interrupted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.bench.openai_stream import Record, StreamingClient, completion_body, completion_request
from pdfleet.bench.workloads import Item, length_class
from pdfleet.errors import PdfleetError

Progress = Callable[[int, int | None], None]  # (requests finished, total or None when open-ended)
LAG_TICK_S = 0.005
SPIN_S = 0.002  # the last stretch before a scheduled start, waited by yielding rather than by a timer
PREBUILT = 20000  # requests encoded before the run (the rest, if any, as they start)


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
    """Where the client sends requests: the gateway's address, its client key, the model alias."""

    host: str
    port: int
    key: str | None
    model: str


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


def _request(gw: Gateway, pool: str, item: Item) -> bytes:
    """The request bytes of one item, through the gateway to `pool`."""
    return completion_request(
        gw.host, gw.port, gw.key, pool, completion_body(gw.model, item.prompt, item.output_tokens)
    )


def _record(item: Item, pool: str, long_tokens: int) -> Record:
    """A fresh record for one item."""
    return Record(item.index, pool, length_class(item, long_tokens), item.prompt_tokens, item.output_tokens)


async def warm_up(client: StreamingClient, gw: Gateway, pool: str, items: Sequence[Item], count: int) -> None:
    """`count` short requests (not recorded) so connections, caches and the router are warm; PoolDown when
    every one of them fails (the error names the pool and the first failure)."""
    if count <= 0:
        return
    recs = [Record(-1, pool, "warmup", 0, 4) for _ in range(count)]
    prompts = [it.prompt for it in sorted(items, key=lambda it: it.prompt_tokens)[:count]] or ["warm up"]
    await asyncio.gather(
        *(
            client.run(
                completion_request(
                    gw.host,
                    gw.port,
                    gw.key,
                    pool,
                    completion_body(gw.model, prompts[i % len(prompts)][:2000], 4),
                ),
                rec,
            )
            for i, rec in enumerate(recs)
        )
    )
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
) -> PoolRun:
    """Run `items` through the gateway to `pool` by `schedule`; every request ends as a Record."""
    client = StreamingClient(gw.host, gw.port)
    records: list[Record] = []
    ended: set[int] = set()  # id() of the records whose request ended (the others were cancelled)
    lateness: list[float] = []
    lag: list[float] = []
    finished = asyncio.Event()
    sampler_stop = asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    total = len(items) if schedule.starts is not None or schedule.duration_s is None else None
    done = 0

    async def one(item: Item, due: float | None) -> None:
        """Run one item and record its lateness."""
        nonlocal done
        rec = _record(item, pool, long_tokens)
        records.append(rec)
        request = requests[item.index] if item.index in requests else _request(gw, pool, item)
        if due is not None:
            rec.due = due
            lateness.append(time.perf_counter() - base - due)  # at the start: a cancelled request counts too
        await client.run(request, rec)
        ended.add(id(rec))
        done += 1
        if progress:
            progress(done, total)

    # built before the clock starts: encoding a 30K-token prompt takes a millisecond the schedule cannot spare
    requests = {it.index: _request(gw, pool, it) for it in items[:PREBUILT]}
    lag_task = asyncio.create_task(_lag_monitor(lag, finished))
    sampler = asyncio.create_task(background(sampler_stop)) if background else None
    base = time.perf_counter()
    unix = time.time()
    try:
        if schedule.starts is not None:
            await _open_loop(items, schedule.starts, one, tasks, base, stop)
        else:
            await _closed_loop(items, schedule, one, tasks, base, stop)
        await _drain(tasks, stop, schedule.drain_s)
    finally:
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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


async def _drain(tasks: set[asyncio.Task[None]], stop: asyncio.Event, drain_s: float) -> None:
    """Wait for the requests in flight, at most drain_s, unless the run is stopped."""
    if not tasks or stop.is_set():
        return
    stopper = asyncio.create_task(stop.wait())
    deadline = time.perf_counter() + drain_s
    while tasks and not stop.is_set() and (left := deadline - time.perf_counter()) > 0:
        await asyncio.wait({*tasks, stopper}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()


async def _open_loop(
    items: Sequence[Item],
    starts: Sequence[float],
    one: Callable[[Item, float], Coroutine[Any, Any, None]],
    tasks: set[asyncio.Task[None]],
    base: float,
    stop: asyncio.Event,
) -> None:
    """Start each item at its due time (never early), until done or stopped."""
    for item, due in zip(items, starts, strict=False):
        # A timer wakes the loop up to ~1.5 ms late at P99 even when idle (kernel and VM wake-up, uvloop's
        # 1 ms timers): sleep until SPIN_S before the due time, then yield to the loop until due. The
        # loop keeps serving the streams meanwhile; the cost is CPU, not lateness.
        while (left := due - (time.perf_counter() - base)) > 0:
            if stop.is_set():
                return
            await asyncio.sleep(min(left - SPIN_S, 0.25) if left > SPIN_S else 0)
        if stop.is_set():
            return
        task = asyncio.create_task(one(item, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _closed_loop(
    items: Sequence[Item],
    schedule: Schedule,
    one: Callable[[Item, None], Coroutine[Any, Any, None]],
    tasks: set[asyncio.Task[None]],
    base: float,
    stop: asyncio.Event,
) -> None:
    """C workers, each running one request after another, until the items or the time run out."""
    queue = iter(range(10**9))
    deadline = None if schedule.duration_s is None else base + schedule.duration_s
    limit = len(items) if deadline is None else None

    async def worker() -> None:
        """One closed-loop worker."""
        for i in queue:
            if (
                stop.is_set()
                or (limit is not None and i >= limit)
                or (deadline is not None and time.perf_counter() >= deadline)
            ):
                return
            await one(items[i % len(items)], None)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, schedule.concurrency or 1))]
    for w in workers:
        tasks.add(w)
        w.add_done_callback(tasks.discard)
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({*workers, stopper}, return_when=asyncio.FIRST_COMPLETED)
    while not stop.is_set() and any(not w.done() for w in workers):
        await asyncio.wait({*workers, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
