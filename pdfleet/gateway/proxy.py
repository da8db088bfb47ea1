"""Forwarding an admitted request: open the upstream (falling back to colocated), stream its bytes through.

The response is written chunk by chunk as it arrives, never buffered or re-framed: after the first
chunk, the upstream connection writes each piece straight to the client's transport (upstream.py).
A failure before the first byte moves the request to the next attempt; after it, an SSE stream ends
with an error event and any other body is cut, so the client sees it as incomplete. An SSE stream is
relayed in whole events (an event's start is held until its blank line), so the error event never
completes half an event into JSON no SDK can parse.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from pdfleet.gateway.capture import Capture, OutputCounter
from pdfleet.gateway.connection import UpstreamError, UpstreamResponse, whole_events
from pdfleet.gateway.context import RequestContext
from pdfleet.gateway.errors import error_response, sse_error_event
from pdfleet.gateway.load import LongPrefills, Outstanding, QueueWatch
from pdfleet.gateway.metrics import GatewayMetrics
from pdfleet.gateway.outside import outside_headers
from pdfleet.gateway.policy import LengthClass, Target
from pdfleet.gateway.shadow import Shadowing
from pdfleet.gateway.upstream import UpstreamClient

log = logging.getLogger("pdfleet.gateway")

_NO_QUEUES = QueueWatch()  # a Proxy built without the gateway's shadowing (tests) watches no queue
_ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "messages": "/v1/messages"}
_SSE_TYPE = "text/event-stream"
INSTANCE_HEADER = "X-Pdfleet-Instance"


class _PassThrough(web.StreamResponse):
    """A streamed response whose headers go out in the same write as the first body chunk.

    aiohttp's StreamResponse sends its headers at prepare() in their own syscall (and TCP segment);
    the gateway writes the upstream's first chunk right after, so buffering them saves a write per
    request without delaying anything (write_eof() flushes them when there is no body).
    """

    _send_headers_immediately = False


@dataclass
class _Upstream:
    """An upstream response that produced its first chunk (or ended) within the first-byte timeout."""

    pool: Target
    resp: UpstreamResponse
    base: str = ""


@dataclass
class _Failure:
    """An upstream attempt that failed before its first byte, and why."""

    pool: Target
    reason: str  # connect | timeout | status_5xx | disconnect | bad_response
    detail: str = ""


class _GapMeter:
    """Per streamed chunk: the gap since the previous one into the histogram, stalls counted; on a
    colocated instance (`prefills` set), a stall during a long prefill there counted as caused by it;
    a shadowed request's gaps (`paired`) also go to its shadow series."""

    __slots__ = ("hist", "stalls", "stall_s", "prev", "prefills", "url", "caused", "paired")

    def __init__(
        self, m: GatewayMetrics, model: str, pool: Target, cls: LengthClass, stall_ms: float, t_first: float
    ):
        self.hist = m.child(m.chunk_gap, model, pool, cls)
        self.stalls = m.child(m.stalls, model, pool, cls)
        self.stall_s = stall_ms / 1000.0
        self.prev = t_first
        self.prefills: LongPrefills | None = None
        self.url = ""
        self.caused: Any = None
        self.paired: tuple[Any, Any] | None = None  # the shadow series' gap histogram and stall counter

    def __call__(self) -> None:
        now = time.perf_counter()
        gap = now - self.prev
        prev, self.prev = self.prev, now
        self.hist.observe(gap)
        paired = self.paired
        if paired is not None:
            paired[0].observe(gap)
        if gap > self.stall_s:
            self.stalls.inc()
            if paired is not None:
                paired[1].inc()
            if self.prefills is not None and self.prefills.during(self.url, prev):
                self.caused.inc()


def attempts(ctx: RequestContext) -> list[tuple[Target, str]]:
    """Where to try, in order: the chosen pool (the decider's colocated instance), then one retry on the
    colocated pool; an outside endpoint once."""
    route, decision = ctx.route, ctx.decision
    if route.outside is not None:
        return [("outside", route.outside.base_url)]
    primary, alt = route.colocated_pair(decision.instance)
    if decision.pool == "disagg":
        assert route.disagg is not None
        tries: list[tuple[Target, str]] = [("disagg", route.disagg)]
        if decision.reason != "forced_header":  # a forced pool is for testing: show its failures
            tries.append(("colocated", primary))
        return tries
    colocated: list[tuple[Target, str]] = [("colocated", primary)]
    return colocated + ([("colocated", alt)] if alt else [])


class Proxy:
    """Forwards admitted requests through one upstream client, recording what happened in the metrics."""

    def __init__(
        self,
        upstream: UpstreamClient,
        metrics: GatewayMetrics,
        outstanding: Outstanding,
        shadowing: Shadowing | None = None,
        capture: Capture | None = None,
    ) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.outstanding = outstanding  # each colocated instance's prompt tokens to prefill, streams
        self.prefills = LongPrefills()  # the long prompts each colocated instance is prefilling
        self.shadowing = shadowing if shadowing is not None else Shadowing(metrics, upstream, _NO_QUEUES)
        self.capture = capture if capture is not None else Capture()

    async def forward(self, request: web.BaseRequest, ctx: RequestContext) -> web.StreamResponse:
        """Open upstream (with fallback), then stream its bytes to the client as they arrive."""
        m = self.metrics
        model = ctx.route.model
        outside = ctx.route.outside
        if outside is not None:  # its own key in its API's header; the client's key stays here
            path = outside.path(ctx.endpoint)
            headers = outside_headers(outside, request.headers)
        else:
            path = _ENDPOINTS[ctx.endpoint]
            headers = {
                "Content-Type": "application/json",
                "X-Request-Id": ctx.rid,
                "Accept": request.headers.get("Accept", "*/*"),
            }
        tries = attempts(ctx)
        up: _Upstream | None = None
        failure: _Failure | None = None
        shadowed = (
            self.shadowing.run is not None  # the one comparison while no shadow run is on
            and ctx.decision.pool == "colocated"
            and ctx.decision.reason != "forced_header"
            and self.shadowing.offer(ctx, ctx.policy.counts.in_flight, ctx.policy.spec.decider.stale_s)
        )
        for i, (pool, base) in enumerate(tries):
            last = i == len(tries) - 1
            m.child(m.in_flight, model, pool).inc()
            colocated = pool == "colocated"  # its prompt tokens to prefill there, and a request served
            charged = ctx.decision.effective if colocated else 0
            long_prefill = colocated and ctx.cls == "long"
            if colocated:
                self.outstanding.add(base, charged)
            if long_prefill:
                self.prefills.start(base)
            try:
                got = await self._open(ctx, pool, base, path, headers)
            finally:
                m.child(m.in_flight, model, pool).dec()
                if colocated:  # a first byte (or a failure): its prefill is over
                    self.outstanding.done(base, charged)
                if long_prefill:
                    self.prefills.end(base, time.perf_counter())
            if isinstance(got, _Upstream) and outside is not None and got.resp.status in (401, 403):
                got.resp.close()  # its body could quote the outside key: never relayed
                return self._refused_key(ctx, got.resp.status)
            if isinstance(got, _Upstream) and (got.resp.status < 500 or last):
                up = got
                break
            if isinstance(got, _Upstream):  # a 5xx with another attempt left: drop it, try the next
                got.resp.close()
                failure = _Failure(pool, "status_5xx")
            else:
                failure = got
            log.warning(
                "rid=%s model=%s pool=%s upstream failed before first byte: %s",
                ctx.rid,
                ctx.alias,
                pool,
                failure.detail or failure.reason,
            )
            if not last and pool == "disagg":
                m.child(m.fallbacks, model, ctx.cls, failure.reason).inc()
                fallbacks = ctx.policy.counts.fallbacks
                fallbacks[failure.reason] = fallbacks.get(failure.reason, 0) + 1
        if up is None:
            assert failure is not None
            if self.capture.on:
                self.capture.record(ctx, 0, ctx.policy.spec.estimator.chars_per_token)
            return self._unavailable(ctx, failure)
        fell_back = up.pool != ctx.decision.pool
        count_decision(m, ctx, "fallback" if fell_back else ctx.decision.reason)
        m.child(m.in_flight, model, up.pool).inc()
        tap = OutputCounter(None) if self.capture.on else None
        outcome = "cancelled"
        decoding = up.pool == "colocated"  # a stream a fresh prefill there would stall (the decider's cost)
        if decoding:
            self.outstanding.stream(up.base)
        try:
            out, outcome = await self._stream(request, ctx, up, fell_back, shadowed, tap)
        finally:
            if decoding:
                self.outstanding.ended(up.base)
            if outcome == "cancelled" and up.resp.answered:  # left after the answer's last event
                outcome = "ok"
            m.child(m.in_flight, model, up.pool).dec()
            if shadowed:
                self._paired_end(ctx, up, outcome)
            if tap is not None:
                self.capture.record(ctx, tap.output_tokens(), ctx.policy.spec.estimator.chars_per_token)
        m.child(m.requests, model, up.pool, ctx.cls, str(up.resp.status)).inc()
        m.child(m.duration, model, up.pool, ctx.cls).observe(time.perf_counter() - ctx.t0)
        log_request(ctx, up.pool, up.resp.status, outcome + (" fallback" if fell_back else ""))
        return out

    def _paired_end(self, ctx: RequestContext, up: _Upstream, outcome: str) -> None:
        """A shadowed request's own side, at its end: its outcome and time into the shadow series."""
        m = self.metrics
        labels = self.shadowing.labels(ctx, up.pool, "false")
        ok = outcome == "ok" and up.resp.status < 500
        gone = outcome in ("client_gone", "cancelled")  # the client left: not the pool's failure
        m.child(m.shadow_requests, *labels, "ok" if ok else "cancelled" if gone else "error").inc()
        if ok:
            m.child(m.shadow_duration, *labels).observe(time.perf_counter() - ctx.t0)

    async def _open(
        self, ctx: RequestContext, pool: Target, base: str, path: str, headers: dict[str, str]
    ) -> _Upstream | _Failure:
        """POST upstream and wait for its first chunk within the first-byte timeout."""
        t = ctx.policy.spec.timeouts
        try:
            resp = await self.upstream.post(
                base, path, headers, ctx.body, connect_s=t.connect_s, first_byte_s=t.first_byte_s
            )
        except UpstreamError as exc:
            return _Failure(pool, exc.reason, str(exc))
        return _Upstream(pool, resp, base)

    def _unavailable(self, ctx: RequestContext, failure: _Failure) -> web.Response:
        """When no attempt produced a first byte: 504 after a timeout, 502 after an invalid response
        (nothing of it is relayed), else 503."""
        m = self.metrics
        where = f"model {ctx.alias!r}, pool {failure.pool}"
        if failure.reason == "timeout":
            status, code, msg = 504, "upstream_timeout", f"upstream timed out before responding ({where})"
        elif failure.reason == "bad_response":
            status, code, msg = 502, "upstream_error", f"the upstream sent an invalid HTTP response ({where})"
        else:
            status, code = 503, "upstream_unavailable"
            last = f"last tried: {failure.pool}, {failure.reason}"
            msg = f"no pool can serve model {ctx.alias!r} right now ({last})"
        headers = {"X-Request-Id": ctx.rid, "X-Pdfleet-Decision": ctx.decision.reason}
        resp = error_response(status, msg, code=code, headers=headers, style=ctx.style)
        count_decision(m, ctx, ctx.decision.reason)
        m.child(m.requests, ctx.route.model, failure.pool, ctx.cls, str(resp.status)).inc()
        log_request(ctx, failure.pool, resp.status, "failed")
        return resp

    def _refused_key(self, ctx: RequestContext, status: int) -> web.Response:
        """The outside endpoint refused the gateway's key for the alias: 502 (the client's own key was
        fine), its answer dropped, the operator told which key file to check."""
        msg = (
            f"the outside endpoint of model {ctx.alias!r} refused the gateway's key for it (HTTP {status}); "
            "the gateway's operator must check that alias's key file"
        )
        resp = error_response(
            502, msg, code="outside_key_refused", headers={"X-Request-Id": ctx.rid}, style=ctx.style
        )
        self.metrics.child(self.metrics.requests, ctx.route.model, "outside", ctx.cls, str(resp.status)).inc()
        log.warning(
            "rid=%s model=%s outside endpoint refused the gateway's key: HTTP %d", ctx.rid, ctx.alias, status
        )
        log_request(ctx, "outside", resp.status, "failed")
        return resp

    async def _stream(
        self,
        request: web.BaseRequest,
        ctx: RequestContext,
        up: _Upstream,
        fell_back: bool,
        shadowed: bool = False,
        tap: OutputCounter | None = None,
    ) -> tuple[web.StreamResponse, str]:
        """Copy the upstream body to the client; end with an error event (SSE) or abort if it breaks.
        `shadowed`: its figures also go to the shadow series (shadow="false"); `tap`: the capture's
        output counter, between the relay and the client."""
        m = self.metrics
        resp = up.resp
        spec = ctx.policy.spec
        ctype = resp.headers.get("content-type", "application/json")
        sse = ctype.startswith(_SSE_TYPE)
        out = _PassThrough(
            status=resp.status,
            headers={
                "Content-Type": ctype,
                "X-Request-Id": ctx.rid,
                "X-Pdfleet-Pool": up.pool,
                "X-Pdfleet-Decision": "fallback" if fell_back else ctx.decision.reason,
                "X-Pdfleet-Policy-Version": str(spec.version),
            },
        )
        if fell_back:
            out.headers["X-Pdfleet-Fallback"] = "1"
        if up.pool == "colocated" and up.base in ctx.route.colocated:
            # which colocated instance served it (its position in the policy's list, never its address):
            # the bench attributes a stream's stalls to the long prefills on its own instance by it
            out.headers[INSTANCE_HEADER] = str(ctx.route.colocated.index(up.base))
        if sse:
            out.headers["Cache-Control"] = "no-cache"
            out.headers["X-Accel-Buffering"] = "no"
        elif resp.content_length is not None:
            out.content_length = resp.content_length  # lets the client see a cut body as incomplete
        chunked = out.content_length is None and request.version >= aiohttp.HttpVersion11
        if chunked:
            out.enable_chunked_encoding()
        enc = resp.headers.get("content-encoding")
        if enc:
            out.headers["Content-Encoding"] = enc
        timed = ctx.stream and sse
        model = ctx.route.model
        if timed:
            m.child(m.ttft, model, up.pool, ctx.cls).observe(resp.t_first - ctx.t0)
            if shadowed:
                labels = self.shadowing.labels(ctx, up.pool, "false")
                m.child(m.shadow_ttft, *labels).observe(resp.t_first - ctx.t0)
        mark = None
        try:
            await out.prepare(request)
            if resp.at_eof:  # the whole body came with the first bytes: one write for all
                if tap is not None:
                    tap.feed(resp.first)
                await out.write_eof(resp.first)
                return out, "ok"
            first, held = whole_events(resp.first) if sse else (resp.first, None)
            await out.write(first)  # sends the held-back headers with the first chunk (even empty)
            resp.last_piece = first
            transport: Any = request.transport
            if transport is None:
                raise ConnectionResetError("client went away")
            if tap is not None:
                tap.transport = transport
                tap.feed(first)
                transport = tap
            gaps = self._meter(ctx, up, shadowed) if timed else None
            if gaps is not None and gaps.prefills is not None:
                mark = self.prefills.mark(up.base)
            error = await resp.relay(transport, chunked, gaps, spec.timeouts.idle_s, held)
            if mark is not None and self.prefills.overlapped(up.base, mark):
                m.child(m.long_prefill_overlaps, model, ctx.cls).inc()
            if error == "client_gone":
                raise ConnectionResetError("client went away")
            if error is None:
                await out.write_eof()
                return out, "ok"
        except asyncio.CancelledError:
            resp.close()  # the client went away (handler cancelled): close upstream at once
            if not resp.answered:
                m.child(m.client_disconnects, up.pool).inc()
            raise
        except ConnectionError:  # our write to the client failed: it is gone
            resp.close()
            if resp.answered:  # it left after the answer's last event: served
                return out, "ok"
            m.child(m.client_disconnects, up.pool).inc()
            return out, "client_gone"
        finally:
            resp.close()
        m.child(m.stream_errors, model, up.pool, error).inc()
        log.warning("rid=%s pool=%s stream broke after first byte: %s", ctx.rid, up.pool, error)
        if sse:
            what = "timed out" if error == "timeout" else "failed"
            try:
                await out.write(
                    sse_error_event(  # at an event boundary: whole events only were relayed
                        f"upstream {what} mid-stream (request {ctx.rid})",
                        504 if error == "timeout" else 502,
                        ctx.style,
                    )
                )
                await out.write_eof()
            except ConnectionError:
                pass
        elif request.transport is not None:
            request.transport.abort()  # a non-SSE body cannot carry an error event: cut the connection
        return out, error

    def _meter(self, ctx: RequestContext, up: _Upstream, shadowed: bool) -> _GapMeter:
        """A timed stream's chunk meter: long-prefill stalls on a colocated instance, shadow series
        when shadowed."""
        m = self.metrics
        model = ctx.route.model
        meter = _GapMeter(m, model, up.pool, ctx.cls, ctx.policy.spec.stall_threshold_ms, up.resp.t_first)
        if up.pool == "colocated":
            meter.prefills, meter.url = self.prefills, up.base
            meter.caused = m.child(m.long_prefill_stalls, model, ctx.cls)
        if shadowed:
            labels = self.shadowing.labels(ctx, up.pool, "false")
            meter.paired = (m.child(m.shadow_chunk_gap, *labels), m.child(m.shadow_stalls, *labels))
        return meter


def count_decision(m: GatewayMetrics, ctx: RequestContext, reason: str) -> None:
    """The one reason of a routed request (an outside alias's requests are no P/D decision)."""
    if ctx.route.outside is None:
        m.child(m.decided, ctx.route.model, reason).inc()


def log_request(ctx: RequestContext, pool: str, status: int, outcome: str) -> None:
    """One line per proxied request (never the key itself, only its name)."""
    if ctx.policy.spec.log_requests and log.isEnabledFor(logging.INFO):
        ms = (time.perf_counter() - ctx.t0) * 1000
        d = ctx.decision
        log.info(
            "rid=%s key=%s model=%s class=%s tokens=%d effective=%d decided=%s/%s bucket=%d pool=%s "
            "status=%d outcome=%s ms=%.1f",
            ctx.rid,
            ctx.key.name,
            ctx.alias,
            ctx.cls,
            ctx.tokens,
            d.effective,
            d.pool,
            d.reason,
            d.bucket,
            pool,
            status,
            outcome,
            ms,
        )
