"""The simulator's HTTP API: vLLM's OpenAI-compatible routes over a `Runtime`, with vLLM's wire shapes.

Routes: /health, /ping, /version, /metrics, /v1/models, /tokenize, /detokenize, /v1/completions,
/v1/chat/completions, /v1/messages (Anthropic's Messages API: pdfleet.sim.messages).
A generation request is parsed and validated as vLLM's protocol models do, turned
into a `SimRequest` with a `Sink`, and submitted at its arrival (`pdfleet.sim.intake`: first byte read;
parsing and tokenizing off the event loop); a streamed response's tokens are written by the step
loop (`pdfleet.sim.runtime`), the handler only opens the stream and writes its tail (usage, `[DONE]`).
Errors are vLLM's `{"error": {"message", "type", "param", "code"}}`; --api-key guards /v1/*.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from pdfleet.sim import messages
from pdfleet.sim.config import SimConfig
from pdfleet.sim.engine import SimRequest
from pdfleet.sim.intake import (
    PROMPT_DIGEST_KEY,
    PROMPT_TOKENS_KEY,
    Intake,
    Parsed,
    RequestError,
    check_model,
    json_response,
    take_arrival,
    validate,
    vllm_error_body,
    vllm_error_response,
)
from pdfleet.sim.runtime import Pending, Runtime
from pdfleet.sim.stream import Sink, chunk_frame, sse_event
from pdfleet.tokens import TextCounter


class SimAPI:
    """vLLM's OpenAI-compatible HTTP API for one simulated instance."""

    def __init__(
        self,
        cfg: SimConfig,
        runtime: Runtime,
        registry: CollectorRegistry,
        counter: TextCounter,
        counter_id: str = "",
    ) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.registry = registry
        self.counter = counter
        self.intake = Intake(cfg, counter, counter_id)
        self.intake.block_tokens = runtime.block_tokens  # the KV events publisher's token ids, when on
        self.model_name = cfg.served_model_names[0]
        self._seq = 0

    def close(self) -> None:
        """Stop the intake thread."""
        self.intake.close()

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
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        return app

    # ---- HTTP: auth and small endpoints ------------------------------------------------------------------
    @web.middleware
    async def _auth_middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """--api-key guards /v1/* as vLLM's AuthenticationMiddleware does (health and metrics stay open).

        Once a handler is done, what was read for its request is not the next one's first byte (the
        generation handlers take their arrival, see `pdfleet.sim.intake.ArrivalStamp`).
        """
        try:
            if self.cfg.api_keys and request.path.startswith("/v1") and request.method != "OPTIONS":
                auth = request.headers.get("Authorization", "")
                if not any(auth == f"Bearer {k}" for k in self.cfg.api_keys):
                    return json_response({"error": "Unauthorized"}, status=401)
            return await handler(request)
        finally:
            take_arrival(request, 0.0)

    async def health(self, request: web.Request) -> web.Response:
        """/health and /ping: 200 while the server runs."""
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        """/version."""
        return json_response({"version": "pdfleet-sim"})

    async def prom(self, request: web.Request) -> web.Response:
        """/metrics: this instance's registry in Prometheus text format."""
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
            body = await self.intake.body(await request.read())
            self._check_model(body)
            n = await self.intake.count(body)
        except RequestError as exc:
            return exc.response
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
            body = await self.intake.body(await request.read())
            self._check_model(body)
        except RequestError as exc:
            return exc.response
        tokens = body.get("tokens")
        n = len(tokens) if isinstance(tokens, list) else 0
        return json_response({"prompt": self.runtime.filler.text(n)})

    # ---- HTTP: generation ---------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        """/v1/completions."""
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """/v1/chat/completions."""
        return await self._generate(request, "chat")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """/v1/messages (Anthropic Messages API)."""
        return await messages.handle(self.runtime, self.intake, request)

    def _check_model(self, body: dict[str, Any]) -> str:
        """The requested model if served, else vLLM's 404 (a RequestError)."""
        return check_model(body, self.cfg)

    def _parse(self, body: dict[str, Any], kind: str) -> Parsed:
        """Validate a generation request (counting its prompt here, on the caller's thread)."""
        return validate(body, kind, self.cfg, self.counter)

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        """Run one generation request through the engine; stream it or answer with one JSON body.

        The request counts as arrived when its first byte was read; reading the body, parsing and
        tokenizing (in the intake thread) happen before the engine sees it but are not charged to it.
        """
        runtime = self.runtime
        arrival = runtime.clock.at_wall(take_arrival(request, asyncio.get_running_loop().time()))
        with runtime.arriving(arrival) as pending:  # later steps wait for it: its intake is not GPU time
            return await self._admitted(request, kind, arrival, pending)

    async def _admitted(
        self, request: web.Request, kind: str, arrival: float, pending: Pending
    ) -> web.StreamResponse:
        """Read, validate and count the request, hand it to the engine at `arrival`, answer it."""
        runtime = self.runtime
        try:
            prepared = await self.intake.prepare(await request.read(), kind)
        except RequestError as exc:
            return exc.response
        body = prepared.body
        model, prompt_tokens, max_tokens, finish, stream, include_usage = prepared.parsed
        if not prepared.counted:
            runtime.metrics.prompt_counts_reused += 1
        kv = runtime.kv
        remote_decode, remote_prefill = kv.role_of(body) if kv is not None else (False, None)
        self._seq += 1
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{base}"
        sink = Sink(kind, rid, model, stream, include_usage, asyncio.get_running_loop())
        sink.finish_reason = finish
        kv_id = kv.hold_key(body, rid) if kv is not None else ""  # what P holds the blocks under
        if kv is not None and kv_id and remote_prefill is not None and not kv.mooncake:
            remote_prefill = {**remote_prefill, "remote_request_id": kv_id}  # 0.11: the id both legs derive
        req = SimRequest(
            f"{rid}-{self._seq}",
            prompt_tokens,
            max_tokens,
            remote_decode=remote_decode,
            remote_prefill=remote_prefill,
            sink=sink,
            kv_id=kv_id,
            block_hashes=prepared.hashes,
        )
        runtime.metrics.max_tokens_hist.observe(max_tokens)
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
            )
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            request.writer.send_headers()
            sink.transport = request.transport
        runtime.submit(req, arrival)
        pending.done()
        try:
            await sink.done
        except asyncio.CancelledError:
            # the client went away (aiohttp cancels the handler): vLLM aborts the request
            runtime.abort(req)
            raise
        if resp is not None:
            return await self._stream_tail(resp, req, sink)
        if sink.error:
            return vllm_error_response(sink.error, "InternalServerError", 500)
        if req.finish_reason == "abort":
            return vllm_error_response("Request aborted", "InternalServerError", 500)
        return json_response(self._full_body(req, sink, kind, prepared.digest))

    async def _stream_tail(self, resp: web.StreamResponse, req: SimRequest, sink: Sink) -> web.StreamResponse:
        """After the last token: the usage event (if asked), `data: [DONE]`, end of body."""
        transport = sink.transport
        if transport is None or transport.is_closing():
            return resp
        tail = b""
        if sink.error:
            tail += sse_event(vllm_error_body(sink.error, "InternalServerError", 500))
        elif sink.include_usage:
            usage = {
                "id": sink.rid,
                "object": sink.chunk_object,
                "created": sink.created,
                "model": sink.model,
                "choices": [],
                "usage": self._usage(req),
            }
            tail += sse_event(usage)
        tail += b"data: [DONE]\n\n"
        with contextlib.suppress(ConnectionError, RuntimeError):
            transport.write(chunk_frame(tail))
            await resp.write_eof()
        return resp

    @staticmethod
    def _usage(req: SimRequest) -> dict[str, Any]:
        """The OpenAI usage object of a finished request."""
        return {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
            "prompt_tokens_details": None,
        }

    def _full_body(self, req: SimRequest, sink: Sink, kind: str, digest: str | None = None) -> dict[str, Any]:
        """The non-streaming response body, with kv_transfer_params for a producer's P/D leg."""
        text = self.runtime.filler.text(req.generated)
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
        kv = self.runtime.kv
        kv_params = kv.params_out(req, sink.finish_reason) if kv is not None else None
        if kv_params is not None and digest is not None:
            # sim-private: lets a simulated consumer skip tokenizing the same prompt again
            kv_params[PROMPT_TOKENS_KEY] = req.prompt_tokens
            kv_params[PROMPT_DIGEST_KEY] = digest
        body.update({"prompt_logprobs": None, "kv_transfer_params": kv_params})
        return body
