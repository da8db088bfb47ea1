"""The engine paced in real time: the step loop, token emission to sinks, request settlement, stats lines.

Steps are scheduled on absolute wall-clock targets (`SimClock.wall_at`), so sleep jitter never
accumulates; if the process cannot keep up, the lag is exported as `pdfleet_sim_*` metrics (see
bench/sim_capacity.py) and logged as a warning at most every `LAG_WARN_EVERY_S`. A probe also times the
event loop itself (`pdfleet_sim_loop_lag_seconds`), so a window in which anything blocked the loop can be
told apart by a bench even when no step was due.

A request's arrival is when its first byte was read (`pdfleet.sim.intake`), and the host's CPU work on it
(reading the body, parsing, tokenizing, hashing its prefix blocks, off the loop) is kept out of simulated
time as far as it can be without delaying anyone's tokens: when the engine was idle, the request's first
step starts at its arrival; when it is busy, a step that starts at or after the arrival waits for that
request's intake (`Runtime.arriving`) as long as its batch can still be decided without its tokens coming
late (`shortest_next_step`: its running requests' decodes alone), so the request joins the step a
GPU would have put it in. An intake
longer than that misses the step and joins a later one: `pdfleet_sim_intake_missed_steps` counts those
steps, `pdfleet_sim_intake_wait_seconds` the wall time spent waiting.

Streaming writes go straight to each connection's transport from the step loop (one SSE event per token
per request, no per-token task switch), which is what lets one core carry hundreds of streams:
`_step_loop` and `_emit` are the hot path, kept free of per-step and per-token allocations, awaits and
indirections beyond what the work needs.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
from collections.abc import Awaitable, Iterator
from typing import Any

from pdfleet.model.vllm_kv_events import EventFormat, event_format
from pdfleet.sim.clock import SimClock
from pdfleet.sim.config import SimConfig
from pdfleet.sim.engine import Engine, SimRequest, State, StepResult
from pdfleet.sim.kv_events import BlockTokens, KvEventPublisher, step_events
from pdfleet.sim.kv_transfer import KVConnector
from pdfleet.sim.metrics import SimMetrics
from pdfleet.sim.stream import DEFAULT_FILLER, Filler, Sink, chunk_frame

log = logging.getLogger("pdfleet.sim")

# Wall seconds behind schedule before the simulated clock gives up catching up and jumps to now. Below it,
# late steps run back to back without sleeping until the schedule is met again (bursts of HTTP work).
RESYNC_AFTER_S = 1.0
# Loop-lag probe period, the lateness (wall seconds) that counts as a disturbance, and how often at most a
# warning about it is logged.
LAG_PROBE_S = 0.05
LAG_WARN_S = 0.1
LAG_WARN_EVERY_S = 10.0
# Wall seconds kept free at the end of a step's intake wait for scheduling and writing its tokens.
INTAKE_MARGIN_S = 0.001


def shortest_next_step(engine: Engine) -> float:
    """A lower bound on the engine's next step length: every running request computes at least one token
    in it (decodes are scheduled first; prefill chunks and new requests only add). 0 when none runs."""
    if not engine.running:
        return 0.0
    ctx = sum(r.computed for r in engine.running)
    n = len(engine.running)
    return engine.perf.step_time(n, ctx + 0.5 * n, ctx + n, 0)


class Pending:
    """A request whose first byte was read at simulated time `arrival` and whose intake is running."""

    __slots__ = ("arrival", "_runtime")

    def __init__(self, runtime: Runtime, arrival: float) -> None:
        self.arrival = arrival
        self._runtime = runtime

    def done(self) -> None:
        """The request was submitted (or refused): steps no longer wait for it (idempotent)."""
        self._runtime._arrived(self)


class Runtime:
    """One simulated engine instance running: its clock, engine, metrics, KV connector and loops."""

    def __init__(self, cfg: SimConfig, filler: Filler = DEFAULT_FILLER) -> None:
        self.cfg = cfg
        self.filler = filler
        self.clock = SimClock(cfg.time_scale)
        self.engine = cfg.engine()
        kv = cfg.kv_transfer
        # vllm:nixl_* are NixlConnector's (MooncakeConnector registers none of them)
        nixl = kv is not None and kv.connector == "NixlConnector"
        mooncake = kv is not None and kv.connector == "MooncakeConnector"
        consumer = kv is not None and kv.is_consumer
        self.metrics = SimMetrics(cfg.max_model_len, nixl, cfg.release, mooncake, consumer)
        self.engine.prompt.observer = self.metrics.prefill_kv_computed.observe
        self._wake = asyncio.Event()
        self.kv = (
            None if kv is None else KVConnector(cfg, kv, self.engine, self.metrics, self.clock, self.wake)
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._window_tokens = (0, 0)
        self._ready_at: float | None = None  # latest time new work became runnable while the loop idled
        self._pending: set[Pending] = set()  # requests in intake, by first-byte time
        self._intake_done = asyncio.Event()
        self.kv_events: KvEventPublisher | None = None  # --kv-events-config's, from open()
        self._event_fmt: EventFormat | None = None  # the release's event format, resolved in open()
        self.block_tokens = BlockTokens(2 * cfg.num_blocks) if cfg.kv_events is not None else None

    # ---- lifecycle --------------------------------------------------------------------------------
    async def open(self) -> None:
        """Start the clock and the KV connector (its side channel), before any request can arrive."""
        self.clock.start(asyncio.get_running_loop())
        if self.kv is not None:
            await self.kv.start()
        if self.cfg.kv_events is not None:
            self._event_fmt = event_format(self.cfg.release.version)
            self.kv_events = await KvEventPublisher.start(self.cfg.kv_events)
            self.engine.pool.events = []

    def start(self) -> None:
        """Start stepping (and the periodic stats lines unless --disable-log-stats)."""
        self._spawn(self._step_loop())
        self._spawn(self._lag_probe())
        if not self.cfg.disable_log_stats:
            self._spawn(self._stats_loop())

    async def stop(self) -> None:
        """Stop stepping, fail whatever is in flight, close the side channel."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for req in list(self.engine.iter_active()):
            self.engine.abort(req.request_id)
            sink: Sink = req.sink
            sink.settle("the server is shutting down")
        if self.kv is not None:
            await self.kv.close()
        if self.kv_events is not None:
            await self.kv_events.close()

    def _publish_kv_events(self) -> None:
        """The step's block pool events, as one batch (vLLM's scheduler publishes one a step)."""
        pool, publisher, tokens = self.engine.pool, self.kv_events, self.block_tokens
        assert publisher is not None and tokens is not None and pool.events is not None
        raw, pool.events = pool.events, []
        if raw and self._event_fmt is not None:
            publisher.publish(step_events(self._event_fmt, raw, tokens, self.cfg.block_size))

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- requests in --------------------------------------------------------------------------------
    def submit(self, req: SimRequest, arrival: float | None = None) -> None:
        """Queue a request that arrived at simulated time `arrival` (default: now) and wake the step loop."""
        now = self.clock.now()
        arrival = now if arrival is None else min(arrival, now)
        self.engine.add(req, arrival)
        self._mark_ready(arrival)
        if self.kv is not None and req.remote_prefill is not None:
            self._spawn(self.kv.keep_alive(req))

    @contextlib.contextmanager
    def arriving(self, arrival: float) -> Iterator[Pending]:
        """While a request that arrived at `arrival` is read, parsed and counted: steps starting at or
        after `arrival` wait for it (`Pending.done` once it is submitted; on leaving, whatever happened)."""
        pending = Pending(self, arrival)
        self._pending.add(pending)
        try:
            yield pending
        finally:
            pending.done()

    def _arrived(self, pending: Pending) -> None:
        if pending in self._pending:
            self._pending.discard(pending)
            self._intake_done.set()

    async def _wait_intake(self, start: float, until_wall: float) -> None:
        """Wait, in wall time until `until_wall` at most, for the intake of the requests that arrived by
        `start`. A step's batch can be decided that late without any token of it coming later than its
        schedule says (the step lasts at least `shortest_next_step`), so the wait never shows to
        the other streams; an intake still running then misses this step (and
        the step is counted) and joins a later one."""
        if not any(p.arrival <= start for p in self._pending):
            return
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        while any(p.arrival <= start for p in self._pending):
            left = until_wall - loop.time()
            if left <= 0:
                self.metrics.intake_missed_steps += 1
                break
            self._intake_done.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._intake_done.wait(), left)
        self.metrics.intake_wait_s += loop.time() - t0

    def abort(self, req: SimRequest) -> None:
        """Drop a request whose client went away, counted as finished_reason abort (once)."""
        if req.state is State.FINISHED:
            return  # finished, failed or already aborted
        self.engine.abort(req.request_id)
        self.metrics.success["abort"] += 1
        sink: Sink | None = req.sink
        if sink is not None:
            sink.settle()
        self._mark_ready(self.clock.now())

    def wake(self) -> None:
        """Tell an idle step loop there is work from now on (KV arrived, blocks freed)."""
        self._mark_ready(self.clock.now())

    def _mark_ready(self, at: float) -> None:
        """Work became runnable at simulated time `at`: an idle loop's next step may start then."""
        if self._ready_at is None or at > self._ready_at:
            self._ready_at = at
        self._wake.set()

    # ---- the step loop ------------------------------------------------------------------------------
    async def _step_loop(self) -> None:
        """Schedule a step, wait until its simulated end in wall time, apply it, emit tokens; repeat."""
        loop = asyncio.get_running_loop()
        engine = self.engine
        m = self.metrics
        kv = self.kv
        clock = self.clock
        sim_now, wall_at, scale = clock.now, clock.wall_at, clock.scale
        expire = kv.expire_leases if kv is not None else None  # only producers hold blocks
        last_end: float | None = None
        idle_since = 0.0
        last_emit_wall = 0.0
        while True:
            now = sim_now()
            if last_end is None:
                # from idle: start when the work became runnable (a request's first byte), not after
                # its parsing and tokenizing, unless the loop itself was late by more than that
                ready, self._ready_at = self._ready_at, None
                start = now if ready is None else min(now, max(idle_since, ready))
                last_emit_wall = loop.time()
            elif (now - last_end) * scale > RESYNC_AFTER_S:
                m.resyncs += 1
                m.resync_lost_s += (now - last_end) * scale
                start = now
                last_emit_wall = loop.time()
            else:
                start = last_end  # back-to-back steps, as on a GPU; wall-clock jitter does not accumulate
            if self._pending and last_end is not None:  # requests that arrived by `start` join this step
                await self._wait_intake(start, wall_at(start + shortest_next_step(engine)) - INTAKE_MARGIN_S)
            if expire is not None:
                expire(start)
            batch = engine.schedule(start)
            for req in batch.kv_loads:  # only consumers admit remote-prefill requests
                assert kv is not None
                self._spawn(kv.load(req))
            if not batch.entries:
                last_end = None
                idle_since = start
                self._wake.clear()
                self._ready_at = None
                expiry = engine.next_expiry()
                timeout = None if expiry is None else max(0.0, (expiry - sim_now()) * scale)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            end = start + batch.duration
            target = wall_at(end)
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            result = engine.complete(batch, end)
            self._emit(result, end)
            if self.kv_events is not None:
                self._publish_kv_events()
            done_wall = loop.time()
            lag = done_wall - target
            m.steps += 1
            m.iteration_tokens.observe(batch.tokens)
            m.busy_sim_s += batch.duration
            m.busy_wall_s += done_wall - last_emit_wall
            last_emit_wall = done_wall
            m.lag_s = lag
            m.step_lag.observe(lag if lag > 0.0 else 0.0)
            if lag > m.max_lag_s:
                m.max_lag_s = lag
            if lag > m.window_lag_s:
                m.window_lag_s = lag
            last_end = end

    def _emit(self, result: StepResult, now: float) -> None:
        """Write each new token to its stream and settle finished requests (the per-token hot path)."""
        m = self.metrics
        itl_counts, itl_bounds = m.itl.counts, m.itl.buckets
        itl_sum = 0.0
        itl_n = 0
        bisect_left = bisect.bisect_left
        filler = self.filler.tokens
        nfill = len(filler)
        finished_state = State.FINISHED
        for req in result.emitted:
            sink: Sink = req.sink
            prev = req.prev_token
            if prev is not None:
                gap = now - prev
                itl_counts[bisect_left(itl_bounds, gap)] += 1
                itl_sum += gap
                itl_n += 1
            else:
                m.ttft.observe(now - req.arrival)
            if not sink.stream:
                continue
            transport = sink.transport
            if transport is None or transport.is_closing():
                self._client_gone(req)
                continue
            token = filler[(req.generated - 1) % nfill]
            tail = token + (sink.last_suffix() if req.state is finished_state else sink.mid)
            if sink.role_sent:
                # chunk_frame inlined: one SSE event per token, framed without building the event first
                transport.write(b"%x\r\n%s%s\r\n" % (len(sink.prefix) + len(tail), sink.prefix, tail))
            else:
                sink.role_sent = True
                data = (sink.role_event() if sink.kind == "chat" else b"") + sink.prefix + tail
                transport.write(chunk_frame(data))
        m.itl.total += itl_sum
        m.itl.n += itl_n
        for req in result.finished:
            self._finish(req, now)

    def _finish(self, req: SimRequest, now: float) -> None:
        """Request-level metrics, then wake the handler."""
        m = self.metrics
        sink: Sink = req.sink
        # the engine finishes only at max_tokens; the sink knows whether that max was the simulated EOS
        m.success[sink.finish_reason] += 1
        m.e2e.observe(now - req.arrival)
        if req.first_scheduled is not None:
            m.queue.observe(max(0.0, req.first_scheduled - req.arrival))
            m.inference.observe(now - req.first_scheduled)
            if req.first_token is not None:
                m.prefill.observe(max(0.0, req.first_token - req.first_scheduled))
        if req.first_token is not None:
            m.decode.observe(now - req.first_token)
            if req.generated > 1:
                m.tpot.observe((now - req.first_token) / (req.generated - 1))
        m.prompt_tokens_hist.observe(req.prompt_tokens)
        m.generation_tokens_hist.observe(req.generated)
        sink.settle()

    def _client_gone(self, req: SimRequest) -> None:
        """A streaming client disconnected: abort the request (a just-finished one is left to its tail)."""
        self.abort(req)

    # ---- loop lag --------------------------------------------------------------------------------------
    async def _lag_probe(self) -> None:
        """Time how late the event loop wakes a timer; warn (rate-limited) when it or a step ran late."""
        loop = asyncio.get_running_loop()
        m = self.metrics
        since = loop.time()  # start of the window the next warning covers
        warned = False
        late_steps_before = m.step_lag.count_above(LAG_WARN_S)
        late_probes = 0
        while True:
            t = loop.time()
            await asyncio.sleep(LAG_PROBE_S)
            late = max(0.0, loop.time() - t - LAG_PROBE_S)
            m.loop_lag.observe(late)
            if late > m.window_lag_s:
                m.window_lag_s = late
            late_probes += late > LAG_WARN_S
            now = loop.time()
            if m.window_lag_s > LAG_WARN_S and (not warned or now - since >= LAG_WARN_EVERY_S):
                late_steps = m.step_lag.count_above(LAG_WARN_S)
                log.warning(
                    "pdfleet-sim: the event loop ran up to %.0f ms behind schedule (in the last %.0f s: %d "
                    "steps and %d loop probes late by more than %.0f ms); wall-clock timings a client "
                    "measured then are disturbed, simulated metrics are not (pdfleet_sim_step_lag_seconds, "
                    "pdfleet_sim_loop_lag_seconds)",
                    1e3 * m.window_lag_s,
                    now - since,
                    late_steps - late_steps_before,
                    late_probes,
                    1e3 * LAG_WARN_S,
                )
                since, warned, late_steps_before, late_probes = now, True, late_steps, 0
                m.window_lag_s = 0.0

    # ---- periodic log lines -----------------------------------------------------------------------------
    async def _stats_loop(self) -> None:
        """vLLM's periodic engine and KV-transfer lines, every --sim-log-interval simulated seconds."""
        interval = self.cfg.log_interval_s
        clock = self.clock
        last = clock.now()
        while True:
            await clock.sleep(interval)
            now = clock.now()
            span = max(now - last, 1e-9)
            last = now
            engine = self.engine
            prompt, gen = engine.prompt.total, engine.generation_tokens
            d_prompt, d_gen = prompt - self._window_tokens[0], gen - self._window_tokens[1]
            self._window_tokens = (prompt, gen)
            if d_prompt or d_gen or engine.num_running or engine.num_waiting:
                log.info(
                    "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f "
                    "tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache "
                    "hit rate: %.1f%%",
                    d_prompt / span,
                    d_gen / span,
                    engine.num_running,
                    engine.num_waiting,
                    engine.kv_usage * 100,
                    0.0,
                )
            if self.kv is not None:
                self.kv.log_transfers()
