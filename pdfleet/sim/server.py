"""The simulator's HTTP server: vLLM's OpenAI-compatible API over an `Engine` paced in real time.

Time: the engine runs on simulated seconds; one simulated second takes `time_scale` wall seconds.
Every duration the server reports (metrics, logs) and every duration it is configured with (lease
timeouts, log interval) is in SIMULATED seconds. Steps are scheduled on absolute wall-clock targets,
so sleep jitter never accumulates; if the process cannot keep up, the lag is exported as
`pdfleet_sim_*` gauges (see bench/sim_capacity.py).

Streaming writes go straight to the connection's transport from the step loop (one SSE event per
token per request, chunked transfer encoding, no per-token task switch), which is what lets one core
carry hundreds of streams.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdfleet.sim.config import SimConfig, describe
from pdfleet.sim.engine import SimRequest, State, StepResult
from pdfleet.sim.metrics import SimCollector, SimMetrics, make_registry
from pdfleet.sim.perf import LinkQueue
from pdfleet.sim.side_channel import PullError, ReadGrant, SideChannelServer, compat_hash, pull
from pdfleet.tokens import TextCounter, count_request_tokens, make_counter

log = logging.getLogger("pdfleet.sim")

# Without max_tokens a real model stops at EOS; the simulator's "EOS" comes after this many tokens
# (chat requests only; completions default to max_tokens=16 as vLLM's CompletionRequest does).
# 128 is a chosen round length, not a measurement: real answer lengths depend on the prompt.
NATURAL_OUTPUT_TOKENS = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# Wall seconds behind schedule before the simulated clock gives up catching up and jumps to now. Below it,
# late steps run back to back without sleeping until the schedule is met again (bursts of HTTP work).
RESYNC_AFTER_S = 1.0
FILLER = tuple(
    f" {w}"
    for w in (
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "tokens",
        "stream",
        "at",
        "the",
        "pace",
        "of",
        "a",
        "simulated",
        "GPU",
        "and",
        "nothing",
        "here",
        "is",
        "real",
    )
)
FILLER_BYTES = tuple(t.encode() for t in FILLER)


_compact = functools.partial(json.dumps, separators=(",", ":"))


def json_response(data: Any, status: int = 200) -> web.Response:
    """JSON as FastAPI/pydantic writes it (compact)."""
    return web.json_response(data, status=status, dumps=_compact)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> web.Response:
    return json_response(error_body(message, err_type, code, param), status=code)


class RequestError(Exception):
    """A client error detected while reading a request (becomes a 4xx ErrorResponse)."""

    def __init__(
        self, message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.response = error_response(message, err_type, code, param)


class Sink:
    """Where a request's output goes: a streamed SSE body or a future for a JSON response."""

    __slots__ = (
        "kind",
        "stream",
        "transport",
        "prefix",
        "mid",
        "created",
        "rid",
        "model",
        "include_usage",
        "done",
        "finish_reason",
        "error",
        "role_sent",
    )

    def __init__(
        self,
        kind: str,
        rid: str,
        model: str,
        stream: bool,
        include_usage: bool,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.kind = kind
        self.rid = rid
        self.model = model
        self.stream = stream
        self.include_usage = include_usage
        self.created = int(time.time())
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = loop.create_future()
        self.finish_reason = "length"
        self.error: str | None = None
        self.role_sent = False  # the first write (chat: role event + first token) is framed separately
        head = {
            "id": rid,
            "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
            "created": self.created,
            "model": model,
        }
        opening = _compact(head)[:-1]
        if kind == "chat":
            self.prefix = ("data: " + opening + ',"choices":[{"index":0,"delta":{"content":"').encode()
            self.mid = b'"},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self.prefix = ("data: " + opening + ',"choices":[{"index":0,"text":"').encode()
            self.mid = b'","logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'

    def role_event(self) -> bytes:
        """The chat stream's first event (role only); vLLM sends it with the first engine output."""
        head = {
            "id": self.rid,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        return b"data: " + _compact(head).encode() + b"\n\n"

    def last_suffix(self) -> bytes:
        if self.kind == "chat":
            end = f'"}},"logprobs":null,"finish_reason":"{self.finish_reason}","stop_reason":null}}]}}\n\n'
            return end.encode()
        return (
            f'","logprobs":null,"finish_reason":"{self.finish_reason}","stop_reason":null}}]}}\n\n'.encode()
        )


def _chunk_frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-encoding frame."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def filler_text(n: int) -> str:
    """The deterministic text of the first n output tokens."""
    return "".join(FILLER[i % len(FILLER)] for i in range(n))


class SimServer:
    """One simulated vLLM instance: HTTP API, step loop, metrics, and (for P/D) the KV side channel."""

    def __init__(self, cfg: SimConfig, counter: TextCounter | None = None) -> None:
        self.cfg = cfg
        self.engine = cfg.engine()
        self.model_name = cfg.served_model_names[0]
        self.counter = counter or make_counter(_tokenizer_file(cfg.tokenizer), cfg.chars_per_token)
        kv = cfg.kv_transfer
        self.metrics = SimMetrics(cfg.max_model_len, pd=kv is not None)
        cache_info = {
            "block_size": str(cfg.block_size),
            "cache_dtype": cfg.kv_cache_dtype,
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "num_gpu_blocks": str(cfg.num_blocks),
            "enable_prefix_caching": "False",
        }
        self.registry = make_registry(SimCollector(self.metrics, self.engine, self.model_name, cache_info))
        self.compat = compat_hash(cfg.model_spec.name, cfg.kv_cache_dtype, cfg.block_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._side: SideChannelServer | None = None
        self._link = LinkQueue(cfg.link)
        self._xfer_window: list[tuple[float, float, int, int]] = []  # (xfer s, post s, bytes, descriptors)
        self._window_tokens = (0, 0)
        self._seq = 0

    # ---- clock ------------------------------------------------------------------------------------
    def sim_now(self) -> float:
        """Simulated seconds since start."""
        assert self._loop is not None
        return (self._loop.time() - self._t0) / self.cfg.time_scale

    def _wall_at(self, sim_t: float) -> float:
        return self._t0 + sim_t * self.cfg.time_scale

    async def sleep_sim(self, seconds: float) -> None:
        """Sleep a simulated duration."""
        await asyncio.sleep(max(0.0, seconds * self.cfg.time_scale))

    # ---- lifecycle --------------------------------------------------------------------------------
    def app(self) -> web.Application:
        """The aiohttp application with vLLM's routes."""
        app = web.Application(middlewares=[self._auth_middleware], client_max_size=64 * 1024**2)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_post("/ping", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.prom)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        return app

    async def start(self, host: str | None = None, port: int | None = None) -> None:
        """Bind the HTTP port (and the side channel on producers) and start the step loop."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        cfg = self.cfg
        log.info("pdfleet-sim: simulating %s", describe(cfg))
        kv = cfg.kv_transfer
        if kv is not None:
            log.info("Creating v1 connector with name: %s and engine_id: %s", kv.connector, kv.engine_id)
            log.info("Initializing NIXL Scheduler %s", kv.engine_id)
            log.info("Initializing NIXL wrapper")
            log.info("Initializing NIXL worker %s", kv.engine_id)
            if kv.is_producer:
                self._side = SideChannelServer(kv.engine_id, self.compat, self._grant, self._release)
                await self._side.start(cfg.side_channel_host, cfg.side_channel_port)
                log.info("KV side channel listening on %s:%d", cfg.side_channel_host, cfg.side_channel_port)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        bind_host = cfg.host if host is None else host
        site = web.TCPSite(self._runner, bind_host, cfg.port if port is None else port, reuse_address=True)
        await site.start()
        self._spawn(self._step_loop())
        if not cfg.disable_log_stats:
            self._spawn(self._stats_loop())
        log.info("Starting vLLM API server 0 on http://%s:%d", bind_host or "0.0.0.0", self.bound_port())
        log.info("Application startup complete.")

    def bound_port(self) -> int:
        """The HTTP port actually bound (useful with port 0)."""
        assert self._runner is not None
        addresses = self._runner.addresses
        return int(addresses[0][1]) if addresses else self.cfg.port

    async def stop(self) -> None:
        """Stop stepping, fail whatever is in flight, close the ports."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for req in list(self.engine.iter_active()):
            self.engine.abort(req.request_id)
            sink: Sink = req.sink
            sink.error = "the server is shutting down"
            if not sink.done.done():
                sink.done.set_result(None)
        if self._side is not None:
            await self._side.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- the step loop ------------------------------------------------------------------------------
    async def _step_loop(self) -> None:
        """Schedule a step, wait until its simulated end in wall time, apply it, emit tokens; repeat."""
        loop = asyncio.get_running_loop()
        engine = self.engine
        m = self.metrics
        last_end: float | None = None
        last_emit_wall = 0.0
        while True:
            now = self.sim_now()
            if last_end is None or (now - last_end) * self.cfg.time_scale > RESYNC_AFTER_S:
                if last_end is not None:
                    m.resyncs += 1
                    m.resync_lost_s += (now - last_end) * self.cfg.time_scale
                start = now
                last_emit_wall = loop.time()
            else:
                start = last_end  # back-to-back steps, as on a GPU; wall-clock jitter does not accumulate
            self._expire(start)
            batch = engine.schedule(start)
            for req in batch.kv_loads:
                self._spawn(self._load_kv(req))
            if not batch.entries:
                last_end = None
                self._wake.clear()
                expiry = engine.next_expiry()
                timeout = (
                    None if expiry is None else max(0.0, (expiry - self.sim_now()) * self.cfg.time_scale)
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            end = start + batch.duration
            target = self._wall_at(end)
            delay = target - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            result = engine.complete(batch, end)
            self._emit(result, end)
            done_wall = loop.time()
            lag = done_wall - target
            m.steps += 1
            m.busy_sim_s += batch.duration
            m.busy_wall_s += done_wall - last_emit_wall
            last_emit_wall = done_wall
            m.lag_s = lag
            if lag > m.max_lag_s:
                m.max_lag_s = lag
            last_end = end

    def _emit(self, result: StepResult, now: float) -> None:
        """Write each new token to its stream and settle finished requests (the per-token hot path)."""
        m = self.metrics
        itl_counts, itl_bounds = m.itl.counts, m.itl.buckets
        itl_sum = 0.0
        itl_n = 0
        bisect_left = bisect.bisect_left
        nfill = len(FILLER_BYTES)
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
            token = FILLER_BYTES[(req.generated - 1) % nfill]
            tail = token + (sink.last_suffix() if req.state is finished_state else sink.mid)
            if sink.role_sent:
                transport.write(b"%x\r\n%s%s\r\n" % (len(sink.prefix) + len(tail), sink.prefix, tail))
            else:
                sink.role_sent = True
                data = (sink.role_event() if sink.kind == "chat" else b"") + sink.prefix + tail
                transport.write(_chunk_frame(data))
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
        if not sink.done.done():
            sink.done.set_result(None)

    def _client_gone(self, req: SimRequest) -> None:
        """A streaming client disconnected: abort the request (counted as finished_reason abort)."""
        if req.state is State.FINISHED:
            return  # its last token was just produced; the tail write will notice the closed connection
        self.engine.abort(req.request_id)
        self.metrics.success["abort"] += 1
        sink: Sink = req.sink
        if not sink.done.done():
            sink.done.set_result(None)

    def _expire(self, now: float) -> None:
        """Free producer blocks whose consumer never came, logging as vLLM does."""
        for req in self.engine.expire_held(now):
            self.metrics.nixl_expired += 1
            log.warning(
                "Releasing expired KV blocks for request %s which were retrieved by %d decode worker(s) "
                "within %d seconds.",
                req.request_id,
                0,
                int(self.cfg.abort_timeout_s),
            )

    def wake(self) -> None:
        """Tell an idle step loop there is work."""
        self._wake.set()

    # ---- P/D --------------------------------------------------------------------------------------
    def _grant(self, rid: str) -> ReadGrant | None:
        """Side channel: the size of a held request's KV, or None if unknown/expired."""
        req = self.engine.held_request(rid)
        if req is None:
            return None
        return ReadGrant(
            req.prompt_tokens, len(req.block_ids), req.prompt_tokens * self.cfg.kv_bytes_per_token
        )

    def _release(self, rid: str) -> None:
        """Side channel: the consumer read the blocks; free them and maybe admit waiting work."""
        if self.engine.release_held(rid) is not None:
            self.wake()

    async def _load_kv(self, req: SimRequest) -> None:
        """Consumer: pull the request's KV from its producer over the side channel, then let it decode."""
        params = req.remote_prefill or {}
        timing: dict[str, float] = {}

        async def wait_transfer(grant: ReadGrant) -> None:
            now = self.sim_now()
            end = self._link.reserve(now, grant.nbytes)
            # the modelled setup, not the real loopback handshake (which time scaling would inflate)
            timing["post"] = self.cfg.link.setup_s
            await self.sleep_sim(end - now)
            timing["xfer"] = end - now

        ok = True
        try:
            grant, notified = await pull(params, self.compat, wait_transfer)
            m = self.metrics
            if not notified:
                m.nixl_failed_notifications += 1
            m.nixl_xfer.observe(timing["xfer"])
            m.nixl_post.observe(timing["post"])
            m.nixl_bytes.observe(grant.nbytes)
            m.nixl_descriptors.observe(grant.num_blocks)
            self._xfer_window.append((timing["xfer"], timing["post"], grant.nbytes, grant.num_blocks))
        except PullError as exc:
            ok = False
            self.metrics.nixl_failed_transfers += 1
            if exc.handshake:
                log.error(
                    "Handshake failed for request %s, marking blocks as invalid (%s)", req.request_id, exc
                )
            else:
                log.error(
                    "NIXL transfer failed for request %s with state %s. Marking blocks as invalid.",
                    req.request_id,
                    exc,
                )
        failed = self.engine.kv_loaded(req.request_id, ok)
        if failed is not None:
            sink: Sink = failed.sink
            sink.error = f"KV transfer for request {failed.request_id} failed (kv_load_failure_policy=fail)"
            self.metrics.success["error"] += 1
            if not sink.done.done():
                sink.done.set_result(None)
        self.wake()

    # ---- periodic log lines -----------------------------------------------------------------------------
    async def _stats_loop(self) -> None:
        """vLLM's periodic engine and KV-transfer lines, every --sim-log-interval simulated seconds."""
        interval = self.cfg.log_interval_s
        last = self.sim_now()
        while True:
            await self.sleep_sim(interval)
            now = self.sim_now()
            span = max(now - last, 1e-9)
            last = now
            prompt, gen = self.engine.prompt_tokens_computed, self.engine.generation_tokens
            d_prompt, d_gen = prompt - self._window_tokens[0], gen - self._window_tokens[1]
            self._window_tokens = (prompt, gen)
            engine = self.engine
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
            if self._xfer_window:
                self._log_transfers()

    def _log_transfers(self) -> None:
        """vLLM's periodic `KV Transfer metrics: ...` line over the transfers since the last one."""
        window, self._xfer_window = self._xfer_window, []
        xfers = sorted(w[0] for w in window)
        posts = sorted(w[1] for w in window)
        total_bytes = sum(w[2] for w in window)
        n = len(window)
        log.info(
            "KV Transfer metrics: Num successful transfers=%d, Avg xfer time (ms)=%.3f, P90 xfer time "
            "(ms)=%.3f, Avg post time (ms)=%.3f, P90 post time (ms)=%.3f, Avg MB per transfer=%.3f, "
            "Throughput (MB/s)=%.3f, Avg number of descriptors=%.1f",
            n,
            1e3 * sum(xfers) / n,
            1e3 * xfers[min(n - 1, int(0.9 * n))],
            1e3 * sum(posts) / n,
            1e3 * posts[min(n - 1, int(0.9 * n))],
            total_bytes / n / 1e6,
            total_bytes / 1e6 / max(sum(xfers), 1e-9),
            sum(w[3] for w in window) / n,
        )

    # ---- HTTP: auth and small endpoints ------------------------------------------------------------------
    @web.middleware
    async def _auth_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """--api-key guards /v1/* as vLLM's AuthenticationMiddleware does (health and metrics stay open)."""
        if self.cfg.api_keys and request.path.startswith("/v1") and request.method != "OPTIONS":
            auth = request.headers.get("Authorization", "")
            if not any(auth == f"Bearer {k}" for k in self.cfg.api_keys):
                return json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": "pdfleet-sim"})

    async def prom(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        """/v1/models as vLLM lists served model names."""
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.cfg.model,
                "parent": None,
                "max_model_len": self.cfg.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in self.cfg.served_model_names
        ]
        return json_response({"object": "list", "data": data})

    async def tokenize(self, request: web.Request) -> web.Response:
        """/tokenize: the pdfleet.tokens count (placeholder token ids; there is no vocabulary)."""
        try:
            body = await self._json(request)
            self._check_model(body)
        except RequestError as exc:
            return exc.response
        n = count_request_tokens(body, self.counter)
        return json_response(
            {
                "count": n,
                "max_model_len": self.cfg.max_model_len,
                "tokens": [1000 + i % 30000 for i in range(n)],
                "token_strs": None,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        """/detokenize: filler text, one word per token id."""
        try:
            body = await self._json(request)
            self._check_model(body)
        except RequestError as exc:
            return exc.response
        tokens = body.get("tokens")
        n = len(tokens) if isinstance(tokens, list) else 0
        return json_response({"prompt": filler_text(n)})

    # ---- HTTP: generation ---------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _json(self, request: web.Request) -> dict[str, Any]:
        """The request body as a JSON object, or a 400 RequestError."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RequestError(f"Invalid JSON body: {exc}") from exc
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object")
        return body

    def _check_model(self, body: dict[str, Any]) -> str:
        """The requested model if served (absent = the first served name), else vLLM's 404."""
        model = body.get("model")
        if model is None:
            return self.model_name
        if model not in self.cfg.served_model_names:
            raise RequestError(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")
        return str(model)

    def _parse(self, body: dict[str, Any], kind: str) -> tuple[str, int, int, str, bool, bool]:
        """Validate a generation request: (model, prompt tokens, max tokens, finish reason, stream, usage)."""
        model = self._check_model(body)
        if kind == "chat":
            if not isinstance(body.get("messages"), list) or not body["messages"]:
                raise RequestError("messages: Field required (a non-empty list)", param="messages")
        else:
            prompt = body.get("prompt")
            if prompt is None or prompt == "" or prompt == []:
                raise RequestError("prompt: Field required", param="prompt")
            if isinstance(prompt, list) and len(prompt) > 1 and not all(isinstance(t, int) for t in prompt):
                raise RequestError(
                    "pdfleet-sim serves one prompt per request (batched prompts are not supported)",
                    param="prompt",
                )
        n = body.get("n", 1)
        if n not in (1, None):
            raise RequestError("pdfleet-sim supports n=1 only", param="n")
        prompt_tokens = max(1, count_request_tokens(body, self.counter))
        limit = self.cfg.max_model_len
        if prompt_tokens >= limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
                param="messages" if kind == "chat" else "prompt",
            )
        max_tokens = body.get("max_completion_tokens") if kind == "chat" else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        for key, val in (("max_tokens", max_tokens), ("min_tokens", body.get("min_tokens"))):
            if val is not None and (
                not isinstance(val, int) or isinstance(val, bool) or val < (1 if key == "max_tokens" else 0)
            ):
                raise RequestError(
                    f"{key} must be at least {1 if key == 'max_tokens' else 0}, got {val}.", param=key
                )
        room = limit - prompt_tokens
        finish = "length"
        if max_tokens is None:
            if kind == "completion":
                max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
            elif body.get("ignore_eos"):
                max_tokens = room
            else:
                max_tokens = min(room, max(NATURAL_OUTPUT_TOKENS, body.get("min_tokens") or 0))
                finish = "stop" if max_tokens < room else "length"
        if max_tokens > room:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
                "in the completion). Please reduce the length of the messages or completion.",
                param="max_tokens",
            )
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        if opts and not stream:
            raise RequestError(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
        return model, prompt_tokens, int(max_tokens), finish, stream, include_usage

    def _pd_role(self, body: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
        """(remote_decode, remote_prefill params) from the request's kv_transfer_params and our kv_role."""
        kv = self.cfg.kv_transfer
        params = body.get("kv_transfer_params")
        if kv is None or not isinstance(params, dict):
            return False, None
        if params.get("do_remote_decode") and kv.is_producer:
            return True, None
        if params.get("do_remote_prefill") and kv.is_consumer:
            return False, params
        return False, None

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        """Run one generation request through the engine; stream it or answer with one JSON body."""
        try:
            body = await self._json(request)
            model, prompt_tokens, max_tokens, finish, stream, include_usage = self._parse(body, kind)
        except RequestError as exc:
            return exc.response
        remote_decode, remote_prefill = self._pd_role(body)
        self._seq += 1
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{base}"
        sink = Sink(kind, rid, model, stream, include_usage, asyncio.get_running_loop())
        sink.finish_reason = finish
        req = SimRequest(
            f"{rid}-{self._seq}",
            prompt_tokens,
            max_tokens,
            remote_decode=remote_decode,
            remote_prefill=remote_prefill,
            sink=sink,
        )
        self.metrics.max_tokens_hist.observe(max_tokens)
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
            )
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            request.writer.send_headers()  # type: ignore[attr-defined]
            sink.transport = request.transport
        self.engine.add(req, self.sim_now())
        self.wake()
        try:
            await sink.done
        except asyncio.CancelledError:
            self.engine.abort(req.request_id)
            self.wake()
            raise
        if resp is not None:
            return await self._stream_tail(resp, req, sink)
        if sink.error:
            return error_response(sink.error, "InternalServerError", 500)
        if req.finish_reason == "abort":
            return error_response("Request aborted", "InternalServerError", 500)
        return json_response(self._full_body(req, sink, kind))

    async def _stream_tail(self, resp: web.StreamResponse, req: SimRequest, sink: Sink) -> web.StreamResponse:
        """After the last token: the usage event (if asked), `data: [DONE]`, end of body."""
        transport = sink.transport
        if transport is None or transport.is_closing():
            return resp
        tail = b""
        if sink.error:
            tail += (
                b"data: " + _compact(error_body(sink.error, "InternalServerError", 500)).encode() + b"\n\n"
            )
        elif sink.include_usage:
            usage = {
                "id": sink.rid,
                "object": "chat.completion.chunk" if sink.kind == "chat" else "text_completion",
                "created": sink.created,
                "model": sink.model,
                "choices": [],
                "usage": self._usage(req),
            }
            tail += b"data: " + _compact(usage).encode() + b"\n\n"
        tail += b"data: [DONE]\n\n"
        with contextlib.suppress(ConnectionError, RuntimeError):
            transport.write(_chunk_frame(tail))
            await resp.write_eof()
        return resp

    @staticmethod
    def _usage(req: SimRequest) -> dict[str, Any]:
        return {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
            "prompt_tokens_details": None,
        }

    def _kv_params_out(self, req: SimRequest) -> dict[str, Any] | None:
        """What a producer returns for the decode side (vLLM NixlConnector request_finished)."""
        if not req.remote_decode or self.cfg.kv_transfer is None:
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(req.block_ids),
            "remote_engine_id": self.cfg.kv_transfer.engine_id,
            "remote_request_id": req.request_id,
            "remote_host": self.cfg.side_channel_host,
            "remote_port": self.cfg.side_channel_port,
            "tp_size": self.cfg.tensor_parallel_size,
        }

    def _full_body(self, req: SimRequest, sink: Sink, kind: str) -> dict[str, Any]:
        """The non-streaming response body, with kv_transfer_params for a producer's P/D leg."""
        text = filler_text(req.generated)
        if kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": sink.finish_reason,
                "stop_reason": None,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": sink.finish_reason,
                "stop_reason": None,
                "prompt_logprobs": None,
            }
            obj = "text_completion"
        body: dict[str, Any] = {
            "id": sink.rid,
            "object": obj,
            "created": sink.created,
            "model": sink.model,
            "choices": [choice],
            "usage": self._usage(req),
        }
        if kind == "chat":
            body.update({"service_tier": None, "system_fingerprint": None})
        body.update({"prompt_logprobs": None, "kv_transfer_params": self._kv_params_out(req)})
        return body


def _tokenizer_file(path: str | None) -> str | None:
    """tokenizer.json from --tokenizer (a file or a directory holding one), else None (character estimate)."""
    if not path:
        return None
    if os.path.isdir(path):
        candidate = os.path.join(path, "tokenizer.json")
        return candidate if os.path.isfile(candidate) else None
    return path if os.path.isfile(path) else None
