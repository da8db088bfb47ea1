"""A request on its way in: when it arrived, its body parsed and validated as vLLM's protocol models do,
its prompt tokens counted — the CPU work done off the event loop so it never stalls other streams.

- `ArrivalStamp` wraps aiohttp's per-connection protocol and notes when a request's first byte was read:
  that is the request's arrival, whatever parsing and tokenizing cost afterwards.
- `Intake` parses, validates and counts in a worker thread (the HF tokenizer releases the GIL while it
  encodes), so a 30K-token prompt does not freeze the streams the step loop is writing.
- P/D: a producer's kv_transfer_params carry the prompt's token count and a digest of the prompt under
  sim-private keys (vLLM 0.11's NixlConnector sends no count; a real vLLM ignores unknown keys). A
  consumer that finds them, with a digest matching its own prompt and counter, skips tokenizing; without
  them (a real vLLM producer, or a router that drops them) it tokenizes, as vLLM does.

Errors are vLLM's `{"error": {"message", "type", "param", "code"}}`; a body Python's JSON parser rejects
(bad syntax, nesting past the recursion limit, integers past 4300 digits, bad UTF-8) is a 400, as
FastAPI's body parsing answers it in vLLM.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeGuard

from aiohttp import web
from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from pdfleet.sim.blocks import block_hashes, once, prompt_units
from pdfleet.sim.config import SimConfig
from pdfleet.sim.kv_events import BlockTokens
from pdfleet.sim.stream import compact
from pdfleet.tokens import TextCounter, count_request_tokens

# Without max_tokens a real model stops at EOS; the simulator's "EOS" comes after this many tokens
# (chat requests only; completions default to max_tokens=16 as vLLM's CompletionRequest does).
# 128 is a chosen round length, not a measurement: real answer lengths depend on the prompt.
NATURAL_OUTPUT_TOKENS = 128
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# Sim-private kv_transfer_params keys (not vLLM's): the producer's prompt count and what it was counted on.
PROMPT_TOKENS_KEY = "pdfleet_sim_prompt_tokens"
PROMPT_DIGEST_KEY = "pdfleet_sim_prompt_digest"


def json_response(data: Any, status: int = 200) -> web.Response:
    """JSON as FastAPI/pydantic writes it (compact)."""
    return web.json_response(data, status=status, dumps=compact)


def vllm_error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict[str, Any]:
    """vLLM's ErrorResponse: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def vllm_error_response(
    message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
) -> web.Response:
    """An ErrorResponse with its status code."""
    return json_response(vllm_error_body(message, err_type, code, param), status=code)


class RequestError(Exception):
    """A client error detected while reading a request (becomes a 4xx ErrorResponse)."""

    def __init__(
        self, message: str, err_type: str = "BadRequestError", code: int = 400, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.response = vllm_error_response(message, err_type, code, param)


class Parsed(NamedTuple):
    """A validated generation request."""

    model: str
    prompt_tokens: int
    max_tokens: int
    finish: str
    stream: bool
    include_usage: bool


# ---- arrival -------------------------------------------------------------------------------------------
class ArrivalStamp(asyncio.Protocol):
    """aiohttp's protocol for one connection, passed every call, noting when a request's first byte came.

    `first_byte_at` is the loop time of the first read since the previous request was handled (the
    handler side takes it when a request starts and clears it again when its handler is done, see
    `take_arrival`); HTTP/1.1 clients send a request only after the answer to the previous one, so the
    first read after that is the next request's first byte.
    """

    def __init__(self, inner: asyncio.Protocol, now: Callable[[], float]) -> None:
        self.inner = inner
        self.first_byte_at: float | None = None
        self._now = now

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Hand the transport to aiohttp."""
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Stamp the first read of a request, then let aiohttp parse it."""
        if self.first_byte_at is None:
            self.first_byte_at = self._now()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        """The client closed its side."""
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone."""
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Flow control, for aiohttp's writer."""
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        """Flow control, for aiohttp's writer."""
        self.inner.resume_writing()


def take_arrival(request: web.Request, now: float) -> float:
    """The loop time the request's first byte was read (`now` if unknown); the next request starts fresh."""
    transport = request.transport
    stamp = transport.get_protocol() if transport is not None else None
    if not isinstance(stamp, ArrivalStamp) or stamp.first_byte_at is None:
        return now
    first, stamp.first_byte_at = stamp.first_byte_at, None
    return min(first, now)


# ---- parsing and validation (pure; run in the intake thread) -----------------------------------------------
def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 RequestError."""
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError(f"Invalid JSON body: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # bad UTF-8, too deep, an integer past 4300 digits
        raise RequestError(f"There was an error parsing the body: {exc}") from exc
    if not isinstance(body, dict):
        raise RequestError("The request body must be a JSON object")
    return body


def check_model(body: dict[str, Any], cfg: SimConfig) -> str:
    """The requested model if served (absent = the first served name), else vLLM's 404."""
    model = body.get("model")
    if model is None:
        return cfg.served_model_names[0]
    if not isinstance(model, str) or model not in cfg.served_model_names:
        raise RequestError(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")
    return model


def _check_prompt(prompt: Any) -> None:
    """A completions prompt vLLM takes: a string, token ids, or one of either in a list."""
    if prompt is None or prompt == "" or prompt == []:
        raise RequestError("prompt: Field required", param="prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(_is_token(t) for t in prompt)):
        return
    if not isinstance(prompt, list):
        raise RequestError("prompt: a string or a list of token ids", param="prompt")
    if len(prompt) > 1:
        raise RequestError(
            "pdfleet-sim serves one prompt per request (batched prompts are not supported)", param="prompt"
        )
    (one,) = prompt
    if not (isinstance(one, str) or (isinstance(one, list) and one and all(_is_token(t) for t in one))):
        raise RequestError("prompt: a string or a list of token ids", param="prompt")


def _is_token(t: object) -> TypeGuard[int]:
    return isinstance(t, int) and not isinstance(t, bool)


def count_prompt(body: dict[str, Any], counter: TextCounter) -> int:
    """Prompt tokens of a validated body; text the tokenizer cannot take is a 400."""
    try:
        return count_request_tokens(body, counter)
    except (UnicodeError, TypeError, ValueError, RecursionError) as exc:
        raise RequestError(f"The prompt could not be tokenized: {exc}", param="prompt") from exc


# vLLM's request models are lax pydantic (`stream: bool | None`): "yes", "off", 1 or 1.0 are booleans to
# it, "maybe" or 2 are 400s. The same adapter gives the simulator vLLM's answer for every value.
_STREAM = TypeAdapter(bool | None)


def _stream_flag(value: Any) -> bool:
    """`stream` read as vLLM reads it (see _STREAM); anything it refuses is a 400 with its message."""
    try:
        return bool(_STREAM.validate_python(value))
    except PydanticValidationError:
        raise RequestError("stream: Input should be a valid boolean", param="stream") from None


def validate(
    body: dict[str, Any], kind: str, cfg: SimConfig, counter: TextCounter, known_tokens: int | None = None
) -> Parsed:
    """Validate a generation request as vLLM does; `known_tokens` (from the producer) skips counting."""
    model = check_model(body, cfg)
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise RequestError("messages: Field required (a non-empty list)", param="messages")
    else:
        _check_prompt(body.get("prompt"))
    n = body.get("n", 1)
    if n not in (1, None):
        raise RequestError("pdfleet-sim supports n=1 only", param="n")
    prompt_tokens = max(1, known_tokens if known_tokens is not None else count_prompt(body, counter))
    limit = cfg.max_model_len
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
        least = 1 if key == "max_tokens" else 0
        if val is not None and (not _is_token(val) or val < least):
            raise RequestError(f"{key} must be at least {least}, got {val}.", param=key)
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
    least = body.get("min_tokens") or 0
    if least > max_tokens:  # vLLM's SamplingParams refuses it (issue 27 N15: the sim accepted it)
        raise RequestError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {least}.",
            param="min_tokens",
        )
    stream = _stream_flag(body.get("stream", False))
    opts = body.get("stream_options") or {}
    if opts and not stream:
        raise RequestError("Stream options can only be defined when `stream=True`.", param="stream_options")
    include_usage = bool(isinstance(opts, dict) and opts.get("include_usage"))
    return Parsed(model, prompt_tokens, int(max_tokens), finish, stream, include_usage)


def prompt_digest(body: dict[str, Any], counter_id: str) -> str:
    """What a prompt count holds for: the prompt (or messages) and the counter that counted it."""
    key = "messages" if "messages" in body else "prompt"
    data = f"{counter_id}\0{key}\0{compact(body.get(key))}".encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# ---- the intake thread -----------------------------------------------------------------------------------
class Prepared(NamedTuple):
    """A generation request ready for the engine: its body, what validation found, its prompt digest."""

    body: dict[str, Any]
    parsed: Parsed
    digest: str | None  # set on producers, for the consumer's shortcut
    counted: bool  # False: the count came from the producer's kv_transfer_params
    hashes: tuple[bytes, ...] = ()  # the prompt's block hashes, for the prefix cache (when it is on)


class Intake:
    """Parses, validates and counts requests in one worker thread, off the event loop."""

    def __init__(self, cfg: SimConfig, counter: TextCounter, counter_id: str) -> None:
        self.cfg = cfg
        self.counter = counter
        self.counter_id = counter_id
        kv = cfg.kv_transfer
        self._producer = kv is not None and kv.is_producer
        self._consumer = kv is not None and kv.is_consumer
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdfleet-sim-intake")
        self.block_tokens: BlockTokens | None = None  # the KV events publisher's, when on

    async def body(self, raw: bytes) -> dict[str, Any]:
        """A JSON object body (for /tokenize and /detokenize), parsed off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, parse_json, raw)

    async def count(self, body: dict[str, Any]) -> int:
        """A body's prompt tokens, counted off the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, count_prompt, body, self.counter)

    async def prepare(self, raw: bytes, kind: str) -> Prepared:
        """Parse, validate and count a generation request off the loop (RequestError: a 4xx)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._prepare, raw, kind)

    def _prepare(self, raw: bytes, kind: str) -> Prepared:
        body = parse_json(raw)
        params = body.get("kv_transfer_params")
        params = params if isinstance(params, dict) else {}
        known = None
        if self._consumer and params.get("do_remote_prefill"):
            tokens = params.get(PROMPT_TOKENS_KEY)
            if (
                _is_token(tokens)
                and tokens > 0
                and params.get(PROMPT_DIGEST_KEY) == prompt_digest(body, self.counter_id)
            ):
                known = tokens
        counter = once(self.counter)  # counting and hashing share one tokenization
        parsed = validate(body, kind, self.cfg, counter, known)
        digest = None
        if self._producer and params.get("do_remote_decode"):
            digest = prompt_digest(body, self.counter_id)
        hashes: tuple[bytes, ...] = ()
        if self.cfg.enable_prefix_caching:  # a consumer too: it looks its prompt up, caches what it pulled
            units = prompt_units(body, counter)
            hashes = block_hashes(units, self.cfg.block_size)
            if self.block_tokens is not None:
                self.block_tokens.register(hashes, units, self.cfg.block_size)
        return Prepared(body, parsed, digest, known is None, hashes)

    def close(self) -> None:
        """Stop the worker thread (work queued behind the current item is dropped)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
