"""Drive a streaming client by an arrival schedule and measure a window: open loop or closed loop.

Open loop (`run_open`): a stream starts at each scheduled time, however many are in flight then, as
independent clients arrive; each start's lateness (began vs due) shows whether the client kept up.
Closed loop (`run_closed`): workers each run one stream after another from their start offsets.
Both take counters at the start and the end of the measured window [warmup, warmup + duration):
the time, the client's event and stream counts, and whatever else a probe reads (CPU, /metrics).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdfleet.bench.client import Span, Stats, StreamClient

Probe = Callable[[], dict[str, float]]  # counters to difference over the window (e.g. CPU seconds)


@dataclass
class LoadRun:
    """What one load run observed: the client's stats, counters at the window's ends, every stream's span."""

    stats: Stats
    before: dict[
        str, float
    ]  # at the measured window's start: "t" (perf_counter s), "events", "done", probe's
    after: dict[str, float]  # the same at its end
    spans: list[Span] = field(default_factory=list)
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
    client: StreamClient, offsets: Sequence[float], duration: float, warmup: float, probe: Probe | None = None
) -> LoadRun:
    """Closed-loop load: one worker per offset, each starting there and running one stream after another.

    Workers start no stream after the window ends and finish the one they run; TTFT is recorded for
    streams started after `warmup`. The client is closed when this returns.
    """
    t_start = time.perf_counter()
    record_after, deadline = t_start + warmup, t_start + warmup + duration
    spans: list[Span] = []

    async def worker(offset: float) -> None:
        if offset:
            await asyncio.sleep(offset)
        while time.perf_counter() < deadline:
            span = Span()
            spans.append(span)
            await client.stream(span, time.perf_counter() >= record_after)

    window = asyncio.ensure_future(measure(client.stats, probe, warmup, duration))
    await asyncio.gather(*(worker(o) for o in offsets))
    client.close()
    before, after = await window
    return LoadRun(client.stats, before, after, spans)


async def run_open(
    client: StreamClient,
    starts: Sequence[float],
    duration: float,
    warmup: float,
    drain: float,
    probe: Probe | None = None,
) -> LoadRun:
    """Open-loop load: a stream starts at each of `starts` (s from now), however many are in flight then.

    TTFT is recorded for streams due in the measured window. After the last start, in-flight streams
    get at most `drain` s to finish; any still running are abandoned and counted unfinished. Each
    start's lateness (when its stream began vs when it was due) shows the client kept up. The client
    is closed when this returns.
    """
    begun: list[tuple[float, Span]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(due: float) -> None:
        span = Span()
        begun.append((due, span))
        await client.stream(span, due >= warmup)

    base = time.perf_counter()
    window = asyncio.ensure_future(measure(client.stats, probe, warmup, duration))
    for due in starts:
        # uvloop timers round to the nearest ms, so a sleep may end early: sleep again until due (never
        # early; late by under ~1 ms, reported). Padding the sleep instead doubles the lateness, and
        # sleeping short to spin the last ms costs ~10% of CPU 0 at 300 starts/s.
        while (left := due - (time.perf_counter() - base)) > 0:
            await asyncio.sleep(left)
        task = asyncio.create_task(one(due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    before, after = await window
    pending: set[asyncio.Task[None]] = set()
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=drain)
    for task in pending:
        task.cancel()
    client.close()
    lateness = [span.start - base - due for due, span in begun if not math.isnan(span.start)]
    return LoadRun(client.stats, before, after, [span for _, span in begun], lateness, len(pending))
