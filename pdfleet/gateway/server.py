"""The gateway's HTTP service: checks the key, picks the pool, streams upstream bytes straight through.

Hot path: the request body is parsed once and forwarded as the same bytes (re-encoded only when the
alias maps to a different upstream model name); the response is written chunk by chunk as it
arrives, never buffered or re-framed. Each request captures the policy object at its start, so a
reload (an atomic reference swap) never changes a request already in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from pdfleet.errors import PdfleetError
from pdfleet.gateway.connection import UpstreamError, UpstreamResponse
from pdfleet.gateway.errors import error_response, sse_error_event
from pdfleet.gateway.keys import AuthResult, authenticate
from pdfleet.gateway.metrics import GatewayMetrics
from pdfleet.gateway.policy import (
    POOLS,
    ActivePolicy,
    Decision,
    LengthClass,
    Pool,
    Route,
    decide,
    length_class,
    load_policy,
    restart_only_changes,
)
from pdfleet.gateway.upstream import UpstreamClient
from pdfleet.tokens import CharEstimate, count_request_tokens


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


try:  # orjson (a vllm-router dependency) parses long prompts ~10x faster than the stdlib
    import orjson

    def _loads(body: bytes) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            # orjson refuses some valid JSON (integers beyond 64 bits): let the stdlib decide
            return json.loads(body)

    def _dumps(obj: Any) -> bytes:
        try:
            return orjson.dumps(obj)
        except TypeError:  # integers beyond 64 bits again
            return _std_dumps(obj)

except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads
    _dumps = _std_dumps


log = logging.getLogger("pdfleet.gateway")

_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# token counting with a real tokenizer on a long prompt takes milliseconds: keep it off the event loop
_EXECUTOR_COUNT_BYTES = 16 * 1024
_SSE_TYPE = "text/event-stream"

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Routes = dict[str, dict[str, Handler]]


class _PassThrough(web.StreamResponse):
    """A streamed response whose headers go out in the same write as the first body chunk.

    aiohttp's StreamResponse sends its headers at prepare() in their own syscall (and TCP segment);
    the gateway writes the upstream's first chunk right after, so buffering them saves a write per
    request without delaying anything (write_eof() flushes them when there is no body).
    """

    _send_headers_immediately = False


class _Reject(Exception):
    """A request the gateway answers itself with an OpenAI error (status, message, code, param)."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param


@dataclass
class _Upstream:
    """An upstream response that produced its first chunk (or ended) within the first-byte timeout."""

    pool: Pool
    resp: UpstreamResponse


@dataclass
class _Failure:
    """An upstream attempt that failed before its first byte, and why."""

    pool: Pool
    reason: str  # connect | timeout | status_5xx | disconnect


def request_id(value: str | None) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one."""
    if value is not None and _REQUEST_ID_OK.fullmatch(value):
        return value
    return os.urandom(16).hex()  # 128 random bits, like uuid4().hex without building a UUID object


def _check_prompt(prompt: Any) -> bool:
    """OpenAI's allowed `prompt` shapes: str, [str], [int], [[int]]."""
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    if all(isinstance(p, str) for p in prompt):
        return True
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return True
    return all(
        isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        for p in prompt
    )


def check_fields(endpoint: str, data: dict[str, Any]) -> None:
    """400 for a missing or mistyped field the gateway needs (the rest is the upstream's business)."""
    if endpoint == "chat":
        msgs = data.get("messages")
        if msgs is None:
            raise _Reject(
                400, "missing required field 'messages' (a list of message objects)", param="messages"
            )
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise _Reject(400, "'messages' must be a non-empty list of message objects", param="messages")
    else:
        if "prompt" not in data:
            raise _Reject(400, "missing required field 'prompt'", param="prompt")
        if not _check_prompt(data["prompt"]):
            raise _Reject(
                400,
                "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists",
                param="prompt",
            )
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _Reject(400, "'stream' must be true or false", param="stream")


class _GapMeter:
    """Per streamed chunk: the gap since the previous one into the histogram, stalls counted."""

    __slots__ = ("hist", "stalls", "stall_s", "prev")

    def __init__(self, m: GatewayMetrics, pool: Pool, cls: LengthClass, stall_ms: float, t_first: float):
        self.hist = m.child(m.chunk_gap, pool, cls)
        self.stalls = m.child(m.stalls, pool, cls)
        self.stall_s = stall_ms / 1000.0
        self.prev = t_first

    def __call__(self) -> None:
        now = time.perf_counter()
        gap = now - self.prev
        self.prev = now
        self.hist.observe(gap)
        if gap > self.stall_s:
            self.stalls.inc()


class Gateway:
    """One gateway instance: the active policy, the upstream client, metrics, reload."""

    def __init__(self, config_path: str | Path, policy: ActivePolicy, *, shutdown_timeout: float = 60.0):
        self.config_path = Path(config_path)
        self.policy = policy
        self.metrics = GatewayMetrics()
        self.metrics.set_policy(policy.spec.version, policy.spec.stage, policy.sha256)
        self.shutdown_timeout = shutdown_timeout
        self.last_reload: dict[str, Any] = {"ok": True, "at": policy.loaded_at, "error": None}
        # no connection cap: the pools apply their own
        self.upstream = UpstreamClient()
        self._reload_lock = asyncio.Lock()

    # ---- lifecycle -------------------------------------------------------------------------

    def routes(self) -> tuple[Routes, Routes | None]:
        """Path -> method -> handler for the main listener and, with `listen.admin_port`, the admin one."""
        get_head = ("GET", "HEAD")
        main: Routes = {
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/completions": {"POST": self._completions},
            "/v1/models": dict.fromkeys(get_head, self._models),
            "/health": dict.fromkeys(get_head, self._health),
            "/metrics": dict.fromkeys(get_head, self._metrics),
        }
        admin: Routes | None = None
        target = main
        if self.policy.spec.listen.admin_port is not None:
            admin = {"/health": dict.fromkeys(get_head, self._health)}
            target = admin
        target["/admin/policy"] = dict.fromkeys(get_head, self._admin_policy)
        target["/admin/reload"] = {"POST": self._admin_reload}
        return main, admin

    def server(self, routes: Routes) -> web.Server:
        """aiohttp's low-level server over one route table (no Application, router or middleware:
        that machinery cost ~5% of the gateway's CPU per request for five fixed paths)."""

        async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
            return await self._dispatch(routes, request)

        return web.Server(dispatch, handler_cancellation=True, access_log=None)

    async def reload(self) -> tuple[bool, str]:
        """Load the policy file again and swap it in atomically; on any problem keep the old one."""
        async with self._reload_lock:
            loop = asyncio.get_running_loop()
            old = self.policy
            try:
                new = await loop.run_in_executor(None, load_policy, self.config_path)
                problems = restart_only_changes(old.spec, new.spec)
                if problems:
                    raise PdfleetError(f"{self.config_path}: " + "; ".join(problems))
            except PdfleetError as exc:
                msg = f"policy reload rejected, version {old.spec.version} stays active: {exc}"
                self.metrics.reloads.labels("rejected").inc()
                self.last_reload = {"ok": False, "at": time.time(), "error": str(exc)}
                log.error("%s", msg.replace("\n", "; "))  # one journal line per reload
                return False, msg
            self.policy = new
            self.metrics.reloads.labels("ok").inc()
            self.metrics.set_policy(new.spec.version, new.spec.stage, new.sha256)
            self.last_reload = {"ok": True, "at": new.loaded_at, "error": None}
            msg = (
                f"policy reloaded: version {old.spec.version} -> {new.spec.version}, "
                f"stage {old.spec.stage} -> {new.spec.stage}"
            )
            log.info("%s", msg)
            return True, msg

    # ---- small endpoints -------------------------------------------------------------------

    async def _dispatch(self, routes: Routes, request: web.BaseRequest) -> web.StreamResponse:
        """Route by path and method; unknown paths, wrong methods and any unexpected error become
        OpenAI error objects."""
        methods = routes.get(request.path)
        if methods is None:
            return error_response(404, f"no such endpoint: {request.method} {request.path}")
        handler = methods.get(request.method)
        if handler is None:
            return error_response(
                405,
                f"method {request.method} is not allowed on {request.path}",
                headers={"Allow": ",".join(methods)},
            )
        try:
            return await handler(request)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("unexpected error handling %s %s", request.method, request.path)
            return error_response(500, "internal gateway error; see the gateway log", code="internal_error")

    def _auth(self, request: web.BaseRequest, policy: ActivePolicy) -> AuthResult:
        """Check the request's key against the policy's keys; raise a 401 _Reject when it fails."""
        result = authenticate(request.headers.get("Authorization"), policy.keys)
        if result.error is not None:
            raise _Reject(401, result.error, code="invalid_api_key")
        return result

    async def _guarded(
        self, request: web.BaseRequest, fn: Callable[[ActivePolicy, AuthResult], Any], admin: bool = False
    ) -> web.StreamResponse:
        """Run a small authenticated endpoint, turning _Reject into an error response."""
        policy = self.policy
        try:
            auth = self._auth(request, policy)
            if admin and not (auth.entry and auth.entry.admin):
                raise _Reject(403, "this endpoint needs an admin key", code="admin_key_required")
            return await fn(policy, auth)
        except _Reject as rej:
            return error_response(rej.status, rej.message, code=rej.code, param=rej.param)

    async def _models(self, request: web.BaseRequest) -> web.StreamResponse:
        """The model aliases, in the OpenAI list format."""

        async def body(policy: ActivePolicy, _auth: AuthResult) -> web.Response:
            created = int(policy.loaded_at)
            data = [
                {"id": a, "object": "model", "created": created, "owned_by": "pdfleet"} for a in policy.routes
            ]
            return web.json_response({"object": "list", "data": data})

        return await self._guarded(request, body)

    async def _health(self, _request: web.BaseRequest) -> web.Response:
        """Liveness: the gateway answers and has a policy."""
        p = self.policy
        return web.json_response({"status": "ok", "policy_version": p.spec.version, "stage": p.spec.stage})

    async def _metrics(self, _request: web.BaseRequest) -> web.Response:
        """Prometheus exposition."""
        body, ctype = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": ctype})

    async def _admin_policy(self, request: web.BaseRequest) -> web.StreamResponse:
        """The active policy's version, stage, pools and counts (admin key)."""

        async def body(policy: ActivePolicy, _auth: AuthResult) -> web.Response:
            return web.json_response({**policy.summary(), "last_reload": self.last_reload})

        return await self._guarded(request, body, admin=True)

    async def _admin_reload(self, request: web.BaseRequest) -> web.StreamResponse:
        """Reload the policy file (admin key); 422 with the error when the new policy is rejected."""

        async def body(_policy: ActivePolicy, _auth: AuthResult) -> web.Response:
            ok, msg = await self.reload()
            if not ok:
                return error_response(422, msg, code="policy_rejected")
            p = self.policy
            return web.json_response(
                {"ok": True, "message": msg, "version": p.spec.version, "stage": p.spec.stage}
            )

        return await self._guarded(request, body, admin=True)

    # ---- proxy -------------------------------------------------------------------------------

    async def _chat(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._proxy(request, "chat")

    async def _completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._proxy(request, "completions")

    async def _proxy(self, request: web.BaseRequest, endpoint: str) -> web.StreamResponse:
        """Authenticate, classify, decide, forward; every gateway-made error is an OpenAI error object."""
        t0 = time.perf_counter()  # uvloop's loop.time() has 1 ms resolution: too coarse for TTFT
        policy = self.policy  # captured: a reload never changes this request
        rid = request_id(request.headers.get("X-Request-Id"))
        model = "-"
        try:
            auth = self._auth(request, policy)
            body = await self._read_body(request, policy.spec.max_body_bytes)
            data = self._parse(body)
            model, route = self._route(policy, data)
            check_fields(endpoint, data)
            forced = self._forced_pool(request, policy, route)
            tokens = await self._count_tokens(policy, data, len(body))
        except _Reject as rej:
            self.metrics.child(self.metrics.requests, model, "none", "none", str(rej.status)).inc()
            return error_response(
                rej.status, rej.message, code=rej.code, param=rej.param, headers={"X-Request-Id": rid}
            )
        cls = length_class(tokens, policy.spec.long_prompt_tokens)
        decision = decide(
            policy.stage, cls, self._sticky_key(request, policy, data, auth), route.disagg is not None, forced
        )
        m = self.metrics
        m.child(m.decisions, policy.spec.stage, cls, decision.pool, decision.reason).inc()
        m.child(m.prompt_tokens, model).observe(tokens)
        policy.counts.requests += 1
        policy.counts.decisions[cls][decision.pool] += 1
        if route.upstream_model is not None and route.upstream_model != model:
            data["model"] = route.upstream_model
            body = _dumps(data)
        stream = bool(data.get("stream", False))
        policy.counts.in_flight += 1
        try:
            return await self._forward(
                request, policy, route, decision, cls, endpoint, body, stream, rid, model, t0, tokens, auth
            )
        finally:
            policy.counts.in_flight -= 1

    async def _read_body(self, request: web.BaseRequest, limit: int) -> bytes:
        """The request body, or 413 as soon as it is known to exceed the limit."""
        too_big = _Reject(
            413, f"request body is larger than the gateway's limit of {limit} bytes", code="request_too_large"
        )
        declared = request.content_length
        if declared is not None and declared > limit:
            raise too_big
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise too_big
                parts.append(chunk)
        except aiohttp.ClientPayloadError as exc:  # malformed chunked encoding and the like
            raise _Reject(400, f"could not read the request body: {exc}") from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @staticmethod
    def _parse(body: bytes) -> dict[str, Any]:
        """The body as a JSON object, else 400."""
        if not body:
            raise _Reject(400, "request body is empty; send a JSON object")
        try:
            data = _loads(body)
        except (ValueError, RecursionError):
            raise _Reject(400, "request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise _Reject(400, "request body must be a JSON object")
        return data

    @staticmethod
    def _route(policy: ActivePolicy, data: dict[str, Any]) -> tuple[str, Route]:
        """The alias and its route; 400 without a model, 404 listing the aliases for an unknown one."""
        model = data.get("model")
        if model is None:
            raise _Reject(400, "missing required field 'model'", param="model")
        if not isinstance(model, str):
            raise _Reject(400, "'model' must be a string", param="model")
        route = policy.routes.get(model)
        if route is None:
            shown = model if len(model) <= 200 else model[:200] + "..."
            raise _Reject(
                404,
                f"the model {shown!r} does not exist on this gateway; available models: "
                + ", ".join(policy.routes),
                code="model_not_found",
                param="model",
            )
        return model, route

    @staticmethod
    def _forced_pool(request: web.BaseRequest, policy: ActivePolicy, route: Route) -> Pool | None:
        """The pool named by the override header, if the policy enables one and the request sends it."""
        name = policy.spec.override_header
        if name is None:
            return None
        value = request.headers.get(name)
        if value is None:
            return None
        value = value.strip().lower()
        if value not in POOLS:
            raise _Reject(400, f"header {name} must be one of: {', '.join(POOLS)}", param=name)
        if value == "disagg" and route.disagg is None:
            raise _Reject(
                400, f"model {route.alias!r} has no disagg pool; header {name} cannot force it", param=name
            )
        return value  # type: ignore[return-value]

    async def _count_tokens(self, policy: ActivePolicy, data: dict[str, Any], size: int) -> int:
        """Prompt tokens by the policy's estimator (a real tokenizer on a long prompt runs in a thread)."""
        if isinstance(policy.counter, CharEstimate) or size < _EXECUTOR_COUNT_BYTES:
            return count_request_tokens(data, policy.counter)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, count_request_tokens, data, policy.counter)

    @staticmethod
    def _sticky_key(
        request: web.BaseRequest, policy: ActivePolicy, data: dict[str, Any], auth: AuthResult
    ) -> str:
        """Session header, else the body's `user`, else the API key's digest."""
        session = request.headers.get(policy.spec.sticky.session_header)
        if session:
            return "s:" + session
        user = data.get("user")
        if policy.spec.sticky.use_user_field and isinstance(user, str) and user:
            return "u:" + user
        return "k:" + (auth.digest or "")

    async def _open(
        self, policy: ActivePolicy, pool: Pool, base: str, path: str, body: bytes, headers: dict[str, str]
    ) -> _Upstream | _Failure:
        """POST upstream and wait for its first chunk within the first-byte timeout."""
        t = policy.spec.timeouts
        try:
            resp = await self.upstream.post(
                base, path, headers, body, connect_s=t.connect_s, first_byte_s=t.first_byte_s
            )
        except UpstreamError as exc:
            return _Failure(pool, exc.reason)
        return _Upstream(pool, resp)

    def _attempts(self, route: Route, decision: Decision) -> list[tuple[Pool, str]]:
        """Where to try, in order: the chosen pool, then one retry on the colocated pool."""
        if decision.pool == "disagg":
            assert route.disagg is not None
            attempts: list[tuple[Pool, str]] = [("disagg", route.disagg)]
            if decision.reason != "header":  # a forced pool is for testing: show its failures
                attempts.append(("colocated", route.next_colocated()[0]))
            return attempts
        primary, alt = route.next_colocated()
        return [("colocated", primary)] + ([("colocated", alt)] if alt else [])

    async def _forward(
        self,
        request: web.BaseRequest,
        policy: ActivePolicy,
        route: Route,
        decision: Decision,
        cls: LengthClass,
        endpoint: str,
        body: bytes,
        stream: bool,
        rid: str,
        model: str,
        t0: float,
        tokens: int,
        auth: AuthResult,
    ) -> web.StreamResponse:
        """Open upstream (with fallback), then stream its bytes to the client as they arrive."""
        m = self.metrics
        path = _ENDPOINTS[endpoint]
        headers = {
            "Content-Type": "application/json",
            "X-Request-Id": rid,
            "Accept": request.headers.get("Accept", "*/*"),
        }
        attempts = self._attempts(route, decision)
        up: _Upstream | None = None
        failure: _Failure | None = None
        for i, (pool, base) in enumerate(attempts):
            last = i == len(attempts) - 1
            m.child(m.in_flight, pool).inc()
            try:
                got = await self._open(policy, pool, base, path, body, headers)
            finally:
                m.child(m.in_flight, pool).dec()
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
                rid,
                model,
                pool,
                failure.reason,
            )
            if not last and pool == "disagg":
                m.child(m.fallbacks, model, failure.reason).inc()
                policy.counts.fallbacks[failure.reason] = policy.counts.fallbacks.get(failure.reason, 0) + 1
        if up is None:
            assert failure is not None
            status = 504 if failure.reason == "timeout" else 503
            msg = (
                f"upstream timed out before responding (model {model!r}, pool {failure.pool})"
                if status == 504
                else f"no pool can serve model {model!r} right now "
                f"(last tried: {failure.pool}, {failure.reason})"
            )
            m.child(m.requests, model, failure.pool, cls, str(status)).inc()
            self._log(policy, rid, model, auth, failure.pool, cls, tokens, status, decision, t0, "failed")
            return error_response(
                status,
                msg,
                code="upstream_unavailable" if status == 503 else "upstream_timeout",
                headers={"X-Request-Id": rid},
            )
        fell_back = up.pool != decision.pool
        m.child(m.in_flight, up.pool).inc()
        try:
            out, outcome = await self._stream(request, policy, up, cls, stream, rid, t0, fell_back)
        finally:
            m.child(m.in_flight, up.pool).dec()
        m.child(m.requests, model, up.pool, cls, str(up.resp.status)).inc()
        m.child(m.duration, up.pool, cls).observe(time.perf_counter() - t0)
        self._log(
            policy,
            rid,
            model,
            auth,
            up.pool,
            cls,
            tokens,
            up.resp.status,
            decision,
            t0,
            outcome + (" fallback" if fell_back else ""),
        )
        return out

    async def _stream(
        self,
        request: web.BaseRequest,
        policy: ActivePolicy,
        up: _Upstream,
        cls: LengthClass,
        stream: bool,
        rid: str,
        t0: float,
        fell_back: bool,
    ) -> tuple[web.StreamResponse, str]:
        """Copy the upstream body to the client; end with an error event (SSE) or abort if it breaks."""
        m = self.metrics
        resp = up.resp
        ctype = resp.headers.get("content-type", "application/json")
        sse = ctype.startswith(_SSE_TYPE)
        out = _PassThrough(
            status=resp.status,
            headers={
                "Content-Type": ctype,
                "X-Request-Id": rid,
                "X-Pdfleet-Pool": up.pool,
                "X-Pdfleet-Policy-Version": str(policy.spec.version),
            },
        )
        if fell_back:
            out.headers["X-Pdfleet-Fallback"] = "1"
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
        timed = stream and sse
        if timed:
            m.child(m.ttft, up.pool, cls).observe(resp.t_first - t0)
        try:
            await out.prepare(request)
            if resp.at_eof:  # the whole body came with the first bytes: one write for all
                await out.write_eof(resp.first)
                return out, "ok"
            await out.write(resp.first)  # sends the held-back headers with the first chunk
            transport = request.transport
            if transport is None:
                raise ConnectionResetError("client went away")
            gaps = _GapMeter(m, up.pool, cls, policy.spec.stall_threshold_ms, resp.t_first) if timed else None
            error = await resp.relay(transport, chunked, gaps, policy.spec.timeouts.idle_s)
            if error == "client_gone":
                raise ConnectionResetError("client went away")
            if error is None:
                await out.write_eof()
                return out, "ok"
        except asyncio.CancelledError:
            resp.close()  # the client went away (handler cancelled): close upstream at once
            m.child(m.client_disconnects, up.pool).inc()
            raise
        except ConnectionError:  # our write to the client failed: it is gone
            resp.close()
            m.child(m.client_disconnects, up.pool).inc()
            return out, "client_gone"
        finally:
            resp.close()
        m.child(m.stream_errors, up.pool, error).inc()
        log.warning("rid=%s pool=%s stream broke after first byte: %s", rid, up.pool, error)
        if sse:
            what = "timed out" if error == "timeout" else "failed"
            try:
                await out.write(
                    b"\n\n"
                    + sse_error_event(
                        f"upstream {what} mid-stream (request {rid})", 504 if error == "timeout" else 502
                    )
                )
                await out.write_eof()
            except ConnectionError:
                pass
        elif request.transport is not None:
            request.transport.abort()  # a non-SSE body cannot carry an error event: cut the connection
        return out, error

    def _log(
        self,
        policy: ActivePolicy,
        rid: str,
        model: str,
        auth: AuthResult,
        pool: str,
        cls: str,
        tokens: int,
        status: int,
        decision: Decision,
        t0: float,
        outcome: str,
    ) -> None:
        """One line per proxied request (never the key itself, only its name)."""
        if policy.spec.log_requests and log.isEnabledFor(logging.INFO):
            ms = (time.perf_counter() - t0) * 1000
            log.info(
                "rid=%s key=%s model=%s class=%s tokens=%d decided=%s/%s bucket=%d pool=%s status=%d "
                "outcome=%s ms=%.1f",
                rid,
                auth.entry.name if auth.entry else "-",
                model,
                cls,
                tokens,
                decision.pool,
                decision.reason,
                decision.bucket,
                pool,
                status,
                outcome,
                ms,
            )


@dataclass
class Running:
    """A started gateway: its bound ports and runners (port 0 in the policy binds a free port)."""

    gateway: Gateway
    runners: list[web.ServerRunner]
    port: int
    admin_port: int | None

    async def close(self) -> None:
        """Stop listening, let in-flight requests finish (up to the shutdown timeout), close upstreams."""
        for runner in reversed(self.runners):
            await runner.cleanup()
        self.gateway.upstream.close()


async def start(gateway: Gateway) -> Running:
    """Bind the main (and admin) listeners; the caller owns the returned Running."""
    listen = gateway.policy.spec.listen
    main_routes, admin_routes = gateway.routes()
    runners: list[web.ServerRunner] = []
    ports: list[int | None] = []
    for routes, port in ((main_routes, listen.port), (admin_routes, listen.admin_port)):
        if routes is None or port is None:
            ports.append(None)
            continue
        runner = web.ServerRunner(gateway.server(routes), shutdown_timeout=gateway.shutdown_timeout)
        await runner.setup()
        site = web.TCPSite(runner, listen.host, port, backlog=2048, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            for r in [*runners, runner]:
                await r.cleanup()
            raise PdfleetError(f"cannot listen on {listen.host}:{port}: {exc.strerror}") from None
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    assert ports[0] is not None
    return Running(gateway, runners, ports[0], ports[1])
