"""Shadow traffic (issue 33): a share of a stage's classes also goes to the P/D pool, answer thrown away.

An operator starts a run (`POST /admin/shadow`: a stage of the policy, a share in percent, minutes):
a request the gateway serves on the colocated pool whose length class that stage would move to P/D
(its percentage for the class is above 0) and whose sticky bucket is in the top `share` buckets (so a
conversation is shadowed whole, and the buckets a live stage moves first are shadowed last) is also
sent to its route's P/D pool. The copy is a task of its own: the client's request never waits for it,
never sees it and never fails with it, and it counts against no key's limits. Its figures and the
client's request's go to the `pdfleet_gateway_shadow_*` series (shadow="true"/"false"), so the two
sides are compared on the same requests at the same time.

Shadows are what goes first: `choose` (pure, below) drops one, counted with the reason, when the
shadow slots are full, when the P/D pool's queue is past its bound or unknown, when the primary pool
is under pressure, or while the shadow pool keeps failing; a reload or a stop cuts the shadows in
flight (`reload`, `stopped`). When no run is on, a request costs one comparison (`run is None`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from pdfleet.gateway.connection import UpstreamError, UpstreamResponse
from pdfleet.gateway.decider import Load, queue_past
from pdfleet.gateway.load import QueueWatch
from pdfleet.gateway.metrics import GatewayMetrics, length_bin
from pdfleet.gateway.policy_spec import ShadowSpec
from pdfleet.gateway.upstream import UpstreamClient
from pdfleet.model.stages import StageSpec

log = logging.getLogger("pdfleet.gateway")

DropReason = Literal[
    "concurrency", "shadow_queue", "primary_pressure", "shadow_unhealthy", "reload", "stopped"
]
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "messages": "/v1/messages"}
_SSE = "text/event-stream"


@dataclass
class ShadowRun:
    """One shadow run: what it shadows (a stage's classes, a share, optionally one model group), until
    when, and what it did so far (for /admin/shadow)."""

    stage: str
    weights: StageSpec
    share: int  # percent of the sticky buckets, from the top
    until: float  # time.monotonic() deadline
    model: str | None = None  # a model group (the metrics' model label); None: every routed alias
    classes: tuple[str, ...] | None = None  # some of the stage's classes only; None: all it moves
    tag: str | None = None  # who started it (the rollout's shadow step), for a stop of its own run only
    started_at: float = field(default_factory=time.time)
    sent: int = 0
    ok: int = 0
    failed: int = 0
    dropped: dict[str, int] = field(default_factory=dict)

    def selects(self, model: str, cls: str, bucket: int) -> bool:
        """Whether a colocated request of this model, class and bucket is to be shadowed."""
        if self.model is not None and model != self.model:
            return False
        if self.classes is not None and cls not in self.classes:
            return False
        return getattr(self.weights, cls) > 0 and bucket >= 100 - self.share

    def summary(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "share": self.share,
            "model": self.model,
            "classes": None if self.classes is None else list(self.classes),
            "tag": self.tag,
            "started_at": self.started_at,
            "seconds_left": max(0.0, self.until - time.monotonic()),
            "sent": self.sent,
            "ok": self.ok,
            "failed": self.failed,
            "dropped": dict(self.dropped),
        }


def choose(
    spec: ShadowSpec,
    in_flight: int,
    loads: Sequence[Load],
    stale_s: float,
    primary_in_flight: int,
    unhealthy: bool,
) -> DropReason | None:
    """For a selected request: None (send the shadow) or why it is dropped, in this order."""
    if in_flight >= spec.max_in_flight:
        return "concurrency"
    if unhealthy:
        return "shadow_unhealthy"
    if queue_past(loads, spec.pd_waiting_max, stale_s):
        return "shadow_queue"
    if spec.primary_in_flight_max is not None and primary_in_flight > spec.primary_in_flight_max:
        return "primary_pressure"
    return None


class _Discard:
    """The sink a shadow's body is relayed into: nothing is kept; `closed` cuts the relay."""

    __slots__ = ("closed",)

    def __init__(self) -> None:
        self.closed = False

    def write(self, _data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0


class _Meter:
    """Per chunk of one side of a shadowed request: the gap into its histogram, stalls counted."""

    __slots__ = ("hist", "stalls", "stall_s", "prev")

    def __init__(self, m: GatewayMetrics, labels: tuple[str, ...], stall_s: float, t_first: float) -> None:
        self.hist = m.child(m.shadow_chunk_gap, *labels)
        self.stalls = m.child(m.shadow_stalls, *labels)
        self.stall_s = stall_s
        self.prev = t_first

    def __call__(self) -> None:
        now = time.perf_counter()
        gap, self.prev = now - self.prev, now
        self.hist.observe(gap)
        if gap > self.stall_s:
            self.stalls.inc()


class Shadowing:
    """The gateway's shadow runs: the one running (or None), the shadows in flight, the drop counts."""

    def __init__(self, metrics: GatewayMetrics, upstream: UpstreamClient, queues: QueueWatch) -> None:
        self.metrics = metrics
        self.upstream = upstream
        self.queues = queues
        self.run: ShadowRun | None = None  # the hot path's one comparison
        self.last: ShadowRun | None = None  # the run that ended last (for status)
        self.ended: str | None = None  # why it ended
        self.spec = ShadowSpec()  # the active policy's bounds (the gateway sets them at load and reload)
        self._sinks: dict[asyncio.Task[None], tuple[_Discard, str]] = {}  # sink, model label
        self._timer: asyncio.TimerHandle | None = None
        self._fail_streak = 0
        self._unhealthy_until = 0.0
        self.on_change: Callable[[bool], None] | None = None  # told when a run starts (True) or ends

    # ---- runs --------------------------------------------------------------------------------

    def start(self, run: ShadowRun) -> None:
        """Start (or replace) the run; it ends by itself at its deadline."""
        if self.run is not None:
            self.stop("stopped")
        self.run = run
        self._fail_streak, self._unhealthy_until = 0, 0.0
        self.metrics.shadow_share.set(run.share)
        if self.on_change is not None:
            self.on_change(True)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, run.until - time.monotonic()), self.stop, "expired")
        log.info("shadow started: stage %s, share %d%%, model %s", run.stage, run.share, run.model or "all")

    def stop(self, why: str = "stopped") -> ShadowRun | None:
        """End the run (its shadows in flight are cut, counted `stopped`); the run that ended."""
        self.cut("stopped")
        run, self.run = self.run, None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.metrics.shadow_share.set(0)
        if run is not None and self.on_change is not None:
            self.on_change(False)
        if run is not None:
            self.last, self.ended = run, why
            log.info("shadow ended (%s): %d sent, %d ok, %d failed", why, run.sent, run.ok, run.failed)
        return run

    def cut(self, reason: DropReason) -> int:
        """Cut every shadow in flight (a reload, a stop): their relays end at their next piece, their
        connections are dropped; the number cut."""
        m = self.metrics
        for task, (sink, model) in self._sinks.items():
            sink.closed = True
            task.cancel()
            m.child(m.shadow_dropped, model, reason).inc()
            if self.run is not None:
                self.run.dropped[reason] = self.run.dropped.get(reason, 0) + 1
        return len(self._sinks)

    def status(self) -> dict[str, Any]:
        """What /admin/shadow shows."""
        return {
            "running": None if self.run is None else self.run.summary(),
            "last": None if self.last is None else {**self.last.summary(), "ended": self.ended},
            "in_flight": len(self._sinks),
        }

    # ---- requests ----------------------------------------------------------------------------

    def offer(self, ctx: Any, primary_in_flight: int, stale_s: float) -> bool:
        """A colocated request (a RequestContext): shadow it when the run selects it and nothing drops
        it. True when a shadow was sent (the client's side is then measured too)."""
        run = self.run
        route = ctx.route
        if (
            run is None
            or route.disagg is None
            or ctx.endpoint not in route.disagg_endpoints
            or not run.selects(route.model, ctx.cls, ctx.decision.bucket)
        ):
            return False
        spec = self.spec
        loads = [self.queues.load(u) for u in (*route.prefill, *route.decode)]
        unhealthy = time.monotonic() < self._unhealthy_until
        reason = choose(spec, len(self._sinks), loads, stale_s, primary_in_flight, unhealthy)
        if reason is not None:
            run.dropped[reason] = run.dropped.get(reason, 0) + 1
            self.metrics.child(self.metrics.shadow_dropped, route.model, reason).inc()
            return False
        sink = _Discard()
        task = asyncio.get_running_loop().create_task(self._send(ctx, sink, run))
        self._sinks[task] = (sink, route.model)
        task.add_done_callback(self._done)
        run.sent += 1
        self.metrics.shadow_in_flight.inc()
        return True

    def _done(self, task: asyncio.Task[None]) -> None:
        self._sinks.pop(task, None)
        self.metrics.shadow_in_flight.dec()

    def labels(self, ctx: Any, pool: str, shadow: str) -> tuple[str, ...]:
        """The series labels of one side of a shadowed request."""
        return (ctx.route.model, pool, ctx.cls, length_bin(ctx.decision.effective), shadow)

    async def _send(self, ctx: Any, sink: _Discard, run: ShadowRun) -> None:
        """Send the copy to the P/D pool, relay its answer into nothing, record its figures."""
        m = self.metrics
        labels = self.labels(ctx, "disagg", "true")
        outcome = "error"
        resp: UpstreamResponse | None = None
        try:
            resp = await self._open(ctx)
            if resp is not None and resp.status < 500:
                outcome = await self._drain(ctx, resp, sink, labels)
        except asyncio.CancelledError:
            outcome = "cancelled"
        finally:
            if resp is not None:
                resp.close()
        self._tally(run, outcome)
        m.child(m.shadow_requests, *labels, outcome).inc()
        if outcome == "ok":
            m.child(m.shadow_duration, *labels).observe(time.perf_counter() - ctx.t0)

    async def _open(self, ctx: Any) -> UpstreamResponse | None:
        """POST the client's body to the P/D pool; None when it failed before its first byte."""
        t = ctx.policy.spec.timeouts
        headers = {"Content-Type": "application/json", "X-Request-Id": f"{ctx.rid}-shadow"}
        try:
            return await self.upstream.post(
                ctx.route.disagg,
                PATHS[ctx.endpoint],
                headers,
                ctx.body,
                connect_s=t.connect_s,
                first_byte_s=t.first_byte_s,
            )
        except UpstreamError as exc:
            log.debug("rid=%s shadow failed before its first byte: %s", ctx.rid, exc)
            return None

    async def _drain(self, ctx: Any, resp: UpstreamResponse, sink: _Discard, labels: tuple[str, ...]) -> str:
        """Relay the shadow's body into the sink, timing it as the proxy times a client's stream."""
        m = self.metrics
        sse = resp.headers.get("content-type", "").startswith(_SSE)
        if sse:
            m.child(m.shadow_ttft, *labels).observe(resp.t_first - ctx.t0)
        if resp.at_eof:
            return "ok"
        spec = ctx.policy.spec
        meter = _Meter(m, labels, spec.stall_threshold_ms / 1000, resp.t_first) if sse else None
        end = await resp.relay(cast(asyncio.Transport, sink), False, meter, spec.timeouts.idle_s)
        return "ok" if end is None else ("cancelled" if end == "client_gone" else "error")

    def _tally(self, run: ShadowRun, outcome: str) -> None:
        """Count the outcome; after `unhealthy_after` failures in a row, drop shadows for a while."""
        if outcome == "ok":
            run.ok += 1
            self._fail_streak = 0
        elif outcome == "error":
            run.failed += 1
            self._fail_streak += 1
            if self._fail_streak >= self.spec.unhealthy_after:
                self._unhealthy_until = time.monotonic() + self.spec.unhealthy_s
                self._fail_streak = 0

    async def close(self) -> None:
        """Stop the run and wait for the cut shadows to finish (shutdown)."""
        self.stop("stopped")
        tasks = list(self._sinks)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
