"""The simulator's HTTP API: vLLM's OpenAI-compatible routes over a `Runtime`, with vLLM's wire shapes.

Routes: /health, /ping, /version, /metrics, /v1/models, /tokenize, /detokenize, /v1/completions,
/v1/chat/completions. A generation request is parsed and validated as vLLM's protocol models do, turned
into a `SimRequest` with a `Sink`, and submitted; a streamed response's tokens are written by the step
loop (`pdfleet.sim.runtime`), the handler only opens the stream and writes its tail (usage, `[DONE]`).
Errors are vLLM's `{"error": {"message", "type", "param", "code"}}`; --api-key guards /v1/*.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from pdfleet.sim.config import SimConfig
from pdfleet.sim.engine import SimRequest
from pdfleet.sim.runtime import Runtime
from pdfleet.sim.stream import Sink, chunk_frame, compact, filler_text, sse_event
from pdfleet.tokens import TextCounter, count_request_tokens

# Without max_tokens a real model stops at EOS; the simulator's "EOS" comes after this many tokens
# (chat requests only; completions default to max_tokens=16 as vLLM's CompletionRequest does).
# 128 is a chosen round length, not a measurement: real answer lengths depend on the prompt.
NATURAL_OUTPUT_TOKENS = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def json_response(data: Any, status: int = 200) -> web.Response:
    """JSON as FastAPI/pydantic writes it (compact)."""
    return web.json_response(data, status=status, dumps=compact)


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> web.Response:
    """An ErrorResponse with its status code."""
    return json_response(error_body(message, err_type, code, param), status=code)


class RequestError(Exception):
    """A client error detected while reading a request (becomes a 4xx ErrorResponse)."""

    def __init__(
        self, message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.response = error_response(message, err_type, code, param)


class SimAPI:
    """vLLM's OpenAI-compatible HTTP API for one simulated instance."""

    def __init__(
        self, cfg: SimConfig, runtime: Runtime, registry: CollectorRegistry, counter: TextCounter
    ) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.registry = registry
        self.counter = counter
        self.model_name = cfg.served_model_names[0]
        self._seq = 0

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
        """/v1/completions."""
        return await self._generate(request, "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """/v1/chat/completions."""
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

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        """Run one generation request through the engine; stream it or answer with one JSON body."""
        try:
            body = await self._json(request)
            model, prompt_tokens, max_tokens, finish, stream, include_usage = self._parse(body, kind)
        except RequestError as exc:
            return exc.response
        kv = self.runtime.kv
        remote_decode, remote_prefill = kv.role_of(body) if kv is not None else (False, None)
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
        self.runtime.metrics.max_tokens_hist.observe(max_tokens)
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(
                headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
            )
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            request.writer.send_headers()  # type: ignore[attr-defined]
            sink.transport = request.transport
        self.runtime.submit(req)
        try:
            await sink.done
        except asyncio.CancelledError:
            self.runtime.abort(req)
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
            tail += sse_event(error_body(sink.error, "InternalServerError", 500))
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
        kv = self.runtime.kv
        kv_params = kv.params_out(req) if kv is not None else None
        body.update({"prompt_logprobs": None, "kv_transfer_params": kv_params})
        return body
