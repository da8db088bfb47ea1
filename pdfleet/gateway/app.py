"""The gateway's HTTP service: routes, the small endpoints, policy reload, start and graceful shutdown.

A proxied request goes through intake (key, body, decision: intake.py), then the proxy (forward and
stream: proxy.py). Each request captures the policy object at its start, so a reload (an atomic
reference swap) never changes a request already in flight.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from pdfleet.errors import PdfleetError
from pdfleet.gateway import tls
from pdfleet.gateway.capture import Capture
from pdfleet.gateway.context import Endpoint
from pdfleet.gateway.deciding import Deciding
from pdfleet.gateway.errors import Reject, Style, error_response
from pdfleet.gateway.intake import admit, authorize, parse_body, read_body, request_id
from pdfleet.gateway.keys import AuthResult, Scope, keys_document
from pdfleet.gateway.limits import Limiter, limits_summary
from pdfleet.gateway.live import StageConflict, apply_update, is_noop, parse_update, unknown_model
from pdfleet.gateway.metrics import GatewayMetrics
from pdfleet.gateway.policy import ActivePolicy, group_staging, load_policy, restart_only_changes
from pdfleet.gateway.proxy import Proxy
from pdfleet.gateway.server import ClientServer
from pdfleet.gateway.shadow import Shadowing
from pdfleet.gateway.shadow_admin import apply_request
from pdfleet.gateway.upstream import UpstreamClient

log = logging.getLogger("pdfleet.gateway")

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
Routes = dict[str, dict[str, Handler]]

# The default gen0 threshold (700) runs a collection every few requests under load; with hundreds of
# streams in flight each one walks many young objects, and gen1/gen2 passes stalled the event loop
# for 10-80 ms (measured at 500 streams). Rarer collections cut the total GC time ~10x and the tail
# with it; cyclic garbage is still collected within a few thousand requests, so memory stays bounded.
GC_THRESHOLDS = (20_000, 20, 100)
MAX_STAGE_BODY = 1024 * 1024  # a stage update is a few hundred bytes; 1 MiB as aiohttp's default was


class Gateway:
    """One gateway instance: the active policy, the upstream client, metrics, reload."""

    def __init__(self, config_path: str | Path, policy: ActivePolicy, *, shutdown_timeout: float = 60.0):
        self.config_path = Path(config_path)
        self.policy = policy
        self.metrics = GatewayMetrics()
        self.metrics.set_policy(policy.spec.version, policy.spec.stage, policy.sha256, policy.tls_expiry)
        # the listeners' one TLS context (None: plain HTTP); a reload renews its certificate in place
        tls_spec = policy.spec.listen.tls
        self.tls = None if tls_spec is None else tls.server_context(tls_spec, self.config_path.parent)
        self.shutdown_timeout = shutdown_timeout
        self.last_reload: dict[str, Any] = {"ok": True, "at": policy.loaded_at, "error": None}
        # no connection cap: the pools apply their own
        self.upstream = UpstreamClient()
        # outlives reloads: what the prefix index learned, the queues, the KV-events feeds
        self.deciding = Deciding(policy, self.metrics.count_kv_event_problem)
        self.shadowing = Shadowing(self.metrics, self.upstream, self.deciding.queues)
        self.shadowing.spec = policy.spec.shadow
        self.shadowing.on_change = self._shadowing_changed
        self.capture = Capture()
        self.capture.configure(policy.spec.capture, self.config_path.parent)
        self.proxy = Proxy(
            self.upstream, self.metrics, self.deciding.outstanding, self.shadowing, self.capture
        )
        self.limiter = Limiter(policy.limits)  # outlives reloads: what each key uses now
        self._reload_lock = asyncio.Lock()
        self._stage_lock = asyncio.Lock()  # one /admin/stage write at a time
        self._self_counting = (self._chat, self._completions, self._messages)  # intake and the proxy count

    # ---- lifecycle -------------------------------------------------------------------------

    def routes(self) -> tuple[Routes, Routes | None]:
        """Path -> method -> handler for the main listener and, with `listen.admin_port`, the admin one."""
        get_head = ("GET", "HEAD")
        main: Routes = {
            "/v1/chat/completions": {"POST": self._chat},
            "/v1/completions": {"POST": self._completions},
            "/v1/messages": {"POST": self._messages},
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
        target["/admin/stage"] = {"POST": self._admin_stage}
        target["/admin/shadow"] = {**dict.fromkeys(get_head, self._admin_shadow), "POST": self._admin_shadow}
        target["/admin/keys"] = dict.fromkeys(get_head, self._admin_keys)
        return main, admin

    def server(self, routes: Routes) -> web.Server:
        """aiohttp's low-level server over one route table (no Application, router or middleware:
        that machinery cost ~5% of the gateway's CPU per request for five fixed paths)."""

        async def dispatch(request: web.BaseRequest) -> web.StreamResponse:
            return await self._dispatch(routes, request)

        return ClientServer(dispatch, limits=lambda: self.policy.spec.clients, count=self._count)

    def _count(self, status: int) -> None:
        """Count a response that belongs to no model (unknown paths, small endpoints, protocol errors)."""
        m = self.metrics
        m.child(m.requests, "-", "none", "none", str(status)).inc()

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
                if self.tls is not None and new.spec.listen.tls is not None:
                    base, source = self.config_path.parent, str(self.config_path)
                    await loop.run_in_executor(None, tls.renew, self.tls, new.spec.listen.tls, base, source)
            except PdfleetError as exc:
                msg = f"policy reload rejected, version {old.spec.version} stays active: {exc}"
                self.metrics.reloads.labels("rejected").inc()
                self.last_reload = {"ok": False, "at": time.time(), "error": str(exc)}
                log.error("%s", msg.replace("\n", "; "))  # one journal line per reload
                return False, msg
            self.policy = new
            self.limiter.configure(new.limits)
            self.deciding.configure(new)
            self.shadowing.spec = new.spec.shadow
            self.shadowing.cut("reload")  # shadows go first: the ones in flight are cut, the run goes on
            self.capture.configure(new.spec.capture, self.config_path.parent)
            self.metrics.reloads.labels("ok").inc()
            self.metrics.set_policy(new.spec.version, new.spec.stage, new.sha256, new.tls_expiry)
            self.last_reload = {"ok": True, "at": new.loaded_at, "error": None}
            msg = (
                f"policy reloaded: version {old.spec.version} -> {new.spec.version}, "
                f"stage {old.spec.stage} -> {new.spec.stage}"
            )
            log.info("%s", msg)
            return True, msg

    def _shadowing_changed(self, on: bool) -> None:
        """Scrape the P/D pool's queues while a shadow run is on (its bound), not otherwise."""
        self.deciding.shadowing = on
        self.deciding.configure(self.policy)

    # ---- small endpoints -------------------------------------------------------------------

    async def _dispatch(self, routes: Routes, request: web.BaseRequest) -> web.StreamResponse:
        """Route by path and method; unknown paths, wrong methods and any unexpected error become
        OpenAI error objects."""
        methods = routes.get(request.path)
        handler = None if methods is None else methods.get(request.method)
        style: Style = "anthropic" if request.path.startswith("/v1/messages") else "openai"
        resp: web.StreamResponse
        if handler is None:
            if methods is None:
                resp = error_response(
                    404, f"no such endpoint: {request.method} {request.path[:200]}", style=style
                )
            else:
                resp = error_response(
                    405,
                    f"method {request.method} is not allowed on {request.path}",
                    headers={"Allow": ",".join(methods)},
                    style=style,
                )
            self._count(resp.status)
            return resp
        try:
            resp = await handler(request)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            log.exception("unexpected error handling %s %s", request.method, request.path[:200])
            self._count(500)
            return error_response(
                500, "internal gateway error; see the gateway log", code="internal_error", style=style
            )
        if handler not in self._self_counting:
            self._count(resp.status)
        return resp

    async def _guarded(
        self, request: web.BaseRequest, fn: Callable[[ActivePolicy, AuthResult], Any], need: Scope = "client"
    ) -> web.StreamResponse:
        """Run a small authenticated endpoint whose key needs scope `need`, turning Reject into an error
        response."""
        policy = self.policy
        try:
            auth = authorize(request.headers.get("Authorization"), policy, need)
            return await fn(policy, auth)
        except Reject as rej:
            return await self._rejected(request, rej.response(), rej.close)

    @staticmethod
    async def _rejected(request: web.BaseRequest, resp: web.Response, close: bool) -> web.Response:
        """A rejection's response; `close` (a body too slow or unreadable): sent, then the connection
        closed, with no lingering read of the rest of the body."""
        if close:
            resp.force_close()
            await resp.prepare(request)
            await resp.write_eof()
            request.protocol.force_close()
        return resp

    async def _models(self, request: web.BaseRequest) -> web.StreamResponse:
        """The model aliases, in the OpenAI list format."""

        async def body(policy: ActivePolicy, auth: AuthResult) -> web.Response:
            created = int(policy.loaded_at)
            assert auth.entry is not None  # _guarded authorized it
            allowed = self.limiter.limits(auth.entry.name).models  # a key sees the aliases it may use
            data = [
                {"id": a, "object": "model", "created": created, "owned_by": "pdfleet"}
                for a in policy.routes
                if allowed is None or a in allowed
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
            summary = {**policy.summary(), "limits": limits_summary(self.limiter)}
            return web.json_response({**summary, "last_reload": self.last_reload})

        return await self._guarded(request, body, "stage")  # the controller reads the stage it runs

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

        return await self._guarded(request, body, "admin")

    async def _admin_stage(self, request: web.BaseRequest) -> web.StreamResponse:
        """Set the live stage (admin key), of one model group when the body names one: rewrite the policy
        file's version and that stage and stages, reload."""

        async def body(policy: ActivePolicy, _auth: AuthResult) -> web.Response:
            # read as a proxied body is (413, 408, 400 for a broken encoding; any nesting is a 400), never
            # aiohttp's request.json(): its 413, a RecursionError and a bad gzip were 500s (issue 27 N8)
            raw = await read_body(request, MAX_STAGE_BODY, policy.spec.clients.body_timeout_s)
            try:
                update = parse_update(parse_body(raw))
            except PdfleetError as exc:
                return error_response(400, str(exc), code="invalid_request")
            async with self._stage_lock:
                active = self.policy.spec
                unknown = unknown_model(active, update)
                if unknown is not None:
                    return error_response(404, unknown, code="model_not_found", param="model")
                if not is_noop(active, update):
                    try:
                        if update.version <= active.version:
                            raise StageConflict(
                                f"version {update.version} does not rise above the active "
                                f"version {active.version} (stage {active.stage})"
                            )
                        apply_update(self.config_path, update)
                    except StageConflict as exc:
                        return error_response(409, str(exc), code="policy_version_conflict")
                    except (PdfleetError, OSError) as exc:
                        return error_response(422, f"stage not applied: {exc}", code="policy_rejected")
                    ok, msg = await self.reload()
                    if not ok:
                        return error_response(422, msg, code="policy_rejected")
            p = self.policy.spec
            if update.model is None:
                return web.json_response({"ok": True, "version": p.version, "stage": p.stage})
            stage = group_staging(p, update.model).stage
            return web.json_response(
                {"ok": True, "version": p.version, "stage": stage, "model": update.model}
            )

        return await self._guarded(request, body, "stage")

    async def _admin_shadow(self, request: web.BaseRequest) -> web.StreamResponse:
        """Read (GET), start or stop (POST) the shadow run (the stage or admin key; shadow_admin.py)."""

        async def body(policy: ActivePolicy, _auth: AuthResult) -> web.Response:
            if request.method == "POST":
                raw = await read_body(request, MAX_STAGE_BODY, policy.spec.clients.body_timeout_s)
                try:
                    apply_request(self.shadowing, policy, parse_body(raw))
                except PdfleetError as exc:
                    return error_response(400, str(exc), code="invalid_request")
            return web.json_response(self.shadowing.status())

        return await self._guarded(request, body, "stage")  # the controller's shadow steps

    async def _admin_keys(self, request: web.BaseRequest) -> web.StreamResponse:
        """The keys this gateway accepts (admin key): name, scope, created, expires, models, when last used
        here; never a key or its hash."""

        async def body(policy: ActivePolicy, _auth: AuthResult) -> web.Response:
            return web.json_response(keys_document(policy.keys, self.limiter.last_used))

        return await self._guarded(request, body, "admin")

    # ---- proxied endpoints -----------------------------------------------------------------

    async def _chat(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._proxy(request, "chat")

    async def _completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._proxy(request, "completions")

    async def _messages(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._proxy(request, "messages")

    async def _proxy(self, request: web.BaseRequest, endpoint: Endpoint) -> web.StreamResponse:
        """Admit, then forward; every gateway-made error is an OpenAI (on /v1/messages: Anthropic) error
        object. The key's in-flight slot is released however the request ends (client gone, upstream
        error, cancellation)."""
        t0 = time.perf_counter()  # uvloop's loop.time() has 1 ms resolution: too coarse for TTFT
        policy = self.policy  # captured: a reload never changes this request
        rid = request_id(request.headers.get("X-Request-Id"))
        limiter = self.limiter
        try:
            ctx = await admit(request, policy, endpoint, rid, t0, self.metrics, limiter, self.deciding)
        except Reject as rej:
            resp = rej.response({"X-Request-Id": rid}, "anthropic" if endpoint == "messages" else "openai")
            return await self._rejected(request, resp, rej.close)
        policy.counts.in_flight += 1
        try:
            return await self.proxy.forward(request, ctx)
        finally:
            policy.counts.in_flight -= 1
            limiter.release(ctx.key.name)
            if ctx.model_slot is not None:
                limiter.release(ctx.model_slot)


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
        await self.gateway.deciding.stop()
        await self.gateway.shadowing.close()
        self.gateway.capture.close()
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
        site = web.TCPSite(
            runner, listen.host, port, backlog=2048, reuse_address=True, ssl_context=gateway.tls
        )
        try:
            await site.start()
        except OSError as exc:
            for r in [*runners, runner]:
                await r.cleanup()
            raise PdfleetError(f"cannot listen on {listen.host}:{port}: {exc.strerror}") from None
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    assert ports[0] is not None
    gateway.deciding.start()
    return Running(gateway, runners, ports[0], ports[1])


async def serve(config: Path, policy: ActivePolicy, shutdown_timeout: float) -> None:
    """Run until SIGTERM/SIGINT; SIGHUP reloads the policy atomically."""
    gateway = Gateway(config, policy, shutdown_timeout=shutdown_timeout)
    running = await start(gateway)
    gc.freeze()  # startup objects live forever: keep them out of every later collection (shorter pauses)
    gc.set_threshold(*GC_THRESHOLDS)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    reloads: set[asyncio.Task[tuple[bool, str]]] = set()

    def on_hup() -> None:
        task = loop.create_task(gateway.reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hup)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    spec = policy.spec
    log.info(
        "listening on %s:%d%s%s, policy %s version %d stage %s",
        spec.listen.host,
        running.port,
        " over HTTPS" if gateway.tls else "",
        f" (admin on port {running.admin_port})" if running.admin_port else "",
        config,
        spec.version,
        spec.stage,
    )
    await stop.wait()
    log.info("stopping: no new connections, letting in-flight requests finish")
    await running.close()
