"""Everything before a request is forwarded: key, body, fields, alias, prompt length, the pool decision.

`admit` runs the steps in order and yields one `RequestContext`, or raises `Reject` with the OpenAI
error the client gets. The steps are pure functions of the request's headers, body and the policy,
except reading the body and counting tokens on a long prompt (which may run in a thread).
The body is parsed once and forwarded as the same bytes (re-encoded only when the alias maps to a
different upstream model name).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from pdfleet.gateway.anthropic import authorize_anthropic, check_messages_fields
from pdfleet.gateway.context import Endpoint, RequestContext
from pdfleet.gateway.deciding import Deciding
from pdfleet.gateway.errors import Reject, Style, anthropic_status
from pdfleet.gateway.keys import AuthResult, Scope, authenticate, refusal
from pdfleet.gateway.limits import Limiter, admit_key, admit_model, check_prompt_limit
from pdfleet.gateway.metrics import GatewayMetrics
from pdfleet.gateway.outside import check_api
from pdfleet.gateway.policy import NO_MODEL, POOLS, ActivePolicy, Pool, Route
from pdfleet.gateway.prompt_ids import prompt_ids
from pdfleet.model.routing import (
    CHOICE_HEADER,
    COLOCATED_CHOICES,
    THRESHOLD_HEADER,
    THRESHOLD_ONS,
    ColocatedChoice,
    ThresholdOn,
)
from pdfleet.tokens import CharEstimate, count_messages_tokens, count_request_tokens


def _std_dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _std_loads(body: bytes) -> Any:
    """The stdlib's parse, refusing what no tokenizer or UTF-8 encoder takes: an unpaired surrogate
    escape such as "\\ud800" (JSON's grammar allows it; orjson refuses it)."""
    data = json.loads(body)
    stack = [data]
    while stack:  # iterative: the document may be nested up to the parser's own limit
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                try:
                    item.encode()
                except UnicodeEncodeError:
                    raise Reject(
                        400,
                        "request body has a string with an unpaired UTF-16 surrogate escape "
                        "(\\ud800-\\udfff alone); send valid Unicode",
                        code="invalid_body",
                    ) from None
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return data


try:  # orjson (a vllm-router dependency) parses long prompts ~10x faster than the stdlib
    import orjson

    def _loads(body: bytes) -> Any:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            # orjson refuses some valid JSON (integers beyond 64 bits): let the stdlib decide
            return _std_loads(body)

    def _dumps(obj: Any) -> bytes:
        try:
            return orjson.dumps(obj)
        except TypeError:  # integers beyond 64 bits again
            return _std_dumps(obj)

except ImportError:  # pragma: no cover - depends on the environment
    _loads = _std_loads
    _dumps = _std_dumps


_REQUEST_ID_OK = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# token counting with a real tokenizer on a long prompt takes milliseconds: keep it off the event loop
_EXECUTOR_COUNT_BYTES = 16 * 1024


def request_id(value: str | None) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one."""
    if value is not None and _REQUEST_ID_OK.fullmatch(value):
        return value
    return os.urandom(16).hex()  # 128 random bits, like uuid4().hex without building a UUID object


def authorize(header: str | None, policy: ActivePolicy, need: Scope = "client") -> AuthResult:
    """Check an Authorization header against the policy's keys: a 401 Reject when it fails, a 403 when
    the key's scope does not reach an endpoint that needs `need`."""
    result = authenticate(header, policy.keys)
    if result.error is not None:
        raise Reject(401, result.error, code="invalid_api_key")
    return permitted(result, need)


def permitted(result: AuthResult, need: Scope) -> AuthResult:
    """The authenticated key's result, or a 403 Reject when its scope does not reach `need`."""
    assert result.entry is not None
    why = refusal(result.entry, need)
    if why is not None:
        raise Reject(403, why, code=f"{need}_key_required")
    return result


async def read_body(request: web.BaseRequest, limit: int, timeout_s: float) -> bytes:
    """The request body, or 413 as soon as it is known to exceed the limit, 408 when it has not all
    arrived within `timeout_s`, 400 when its framing or Content-Encoding is broken."""
    too_big = Reject(
        413, f"request body is larger than the gateway's limit of {limit} bytes", code="request_too_large"
    )
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_big
    content = request.content
    try:
        if content.is_eof():  # the whole body came with the head (the usual case): nothing to wait for
            parts = await _chunks(content, limit, too_big)
        else:
            async with asyncio.timeout(timeout_s):
                parts = await _chunks(content, limit, too_big)
    except TimeoutError:
        raise Reject(
            408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout", close=True
        ) from None
    except (aiohttp.ClientPayloadError, RequestPayloadError):
        # the rest of the body cannot be read either: close rather than read it to its end
        raise Reject(400, _payload_problem(request), code="invalid_body", close=True) from None
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _chunks(content: aiohttp.StreamReader, limit: int, too_big: Reject) -> list[bytes]:
    """The body's pieces as they arrive, `too_big` raised once they pass `limit` bytes."""
    parts: list[bytes] = []
    size = 0
    async for chunk in content.iter_any():
        size += len(chunk)
        if size > limit:
            raise too_big
        parts.append(chunk)
    return parts


def _payload_problem(request: web.BaseRequest) -> str:
    """What was wrong with an unreadable body, in words that quote nothing the client sent."""
    if request.headers.get("Content-Encoding", "identity").strip().lower() != "identity":
        return (
            "could not decode the request body by its Content-Encoding; send the body as JSON, "
            "uncompressed, or compressed as the header says"
        )
    return "could not read the request body: its chunked Transfer-Encoding is malformed"


def parse_body(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, else 400."""
    if not body:
        raise Reject(400, "request body is empty; send a JSON object")
    try:
        data = _loads(body)
    except (ValueError, RecursionError):
        raise Reject(400, "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise Reject(400, "request body must be a JSON object")
    return data


def route_for(policy: ActivePolicy, data: dict[str, Any]) -> tuple[str, Route]:
    """The alias and its route; 400 without a model, 404 listing the aliases for an unknown one."""
    model = data.get("model")
    if model is None:
        raise Reject(400, "missing required field 'model'", param="model")
    if not isinstance(model, str):
        raise Reject(400, "'model' must be a string", param="model")
    route = policy.routes.get(model)
    if route is None:
        shown = model if len(model) <= 200 else model[:200] + "..."
        raise Reject(
            404,
            f"the model {shown!r} does not exist on this gateway; available models: "
            + ", ".join(policy.routes),
            code="model_not_found",
            param="model",
        )
    return model, route


def check_route_api(alias: str, route: Route, endpoint: Endpoint) -> None:
    """400 when an outside alias is called on an endpoint of the other API (nothing is translated)."""
    problem = check_api(alias, route.outside, endpoint)
    if problem is not None:
        raise Reject(400, problem, code="model_api_mismatch", param="model")


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


def check_fields(endpoint: Endpoint, data: dict[str, Any]) -> None:
    """400 for a missing or mistyped field the gateway needs (the rest is the upstream's business)."""
    if endpoint == "messages":
        check_messages_fields(data)
        return
    if endpoint == "chat":
        msgs = data.get("messages")
        if msgs is None:
            raise Reject(
                400, "missing required field 'messages' (a list of message objects)", param="messages"
            )
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise Reject(400, "'messages' must be a non-empty list of message objects", param="messages")
    else:
        if "prompt" not in data:
            raise Reject(400, "missing required field 'prompt'", param="prompt")
        if not _check_prompt(data["prompt"]):
            raise Reject(
                400,
                "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists",
                param="prompt",
            )
    stream = data.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise Reject(400, "'stream' must be true or false", param="stream")


def forced_pool(
    headers: Mapping[str, str], policy: ActivePolicy, route: Route, endpoint: Endpoint = "chat"
) -> Pool | None:
    """The pool named by the override header, if the policy enables one and the request sends it."""
    name = policy.spec.override_header
    if name is None:
        return None
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip().lower()
    if value not in POOLS:
        raise Reject(400, f"header {name} must be one of: {', '.join(POOLS)}", param=name)
    pool: Pool = "disagg" if value == "disagg" else "colocated"
    if route.outside is not None:
        raise Reject(
            400, f"model {route.alias!r} is an outside endpoint; header {name} cannot pick a pool", param=name
        )
    if pool == "disagg" and route.disagg is None:
        raise Reject(
            400, f"model {route.alias!r} has no disagg pool; header {name} cannot force it", param=name
        )
    if pool == "disagg" and endpoint not in route.disagg_endpoints:
        raise Reject(
            400,
            f"model {route.alias!r}: its disagg pool does not carry the {endpoint} endpoint "
            f"(disagg_endpoints: {', '.join(sorted(route.disagg_endpoints))}); header {name} cannot force it",
            param=name,
        )
    return pool


def forced_choice(headers: Mapping[str, str], policy: ActivePolicy, route: Route) -> ColocatedChoice | None:
    """The colocated choice named by the choice header, honoured like the pool override header: only while
    the policy enables that one (a policy without overrides ignores both)."""
    return cast("ColocatedChoice | None", _asked(headers, policy, route, CHOICE_HEADER, COLOCATED_CHOICES))


def forced_threshold(headers: Mapping[str, str], policy: ActivePolicy, route: Route) -> ThresholdOn | None:
    """What the threshold header asks a request's length class be taken from, honoured as the choice
    header is."""
    return cast("ThresholdOn | None", _asked(headers, policy, route, THRESHOLD_HEADER, THRESHOLD_ONS))


def _asked(
    headers: Mapping[str, str], policy: ActivePolicy, route: Route, name: str, values: tuple[str, ...]
) -> str | None:
    """One of `values` named by header `name` (None: not sent, or overrides off); a 400 for another
    value or an outside endpoint (which has no decider)."""
    if policy.spec.override_header is None:
        return None
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip().lower()
    if value not in values:
        raise Reject(400, f"header {name} must be one of: {', '.join(values)}", param=name)
    if route.outside is not None:
        raise Reject(
            400,
            f"model {route.alias!r} is an outside endpoint; header {name} cannot pick an instance",
            param=name,
        )
    return value


async def count_tokens(
    policy: ActivePolicy, data: dict[str, Any], size: int, endpoint: Endpoint = "chat"
) -> int:
    """Prompt tokens by the policy's estimator (a real tokenizer on a long prompt runs in a thread)."""
    count = count_messages_tokens if endpoint == "messages" else count_request_tokens
    if isinstance(policy.counter, CharEstimate) or size < _EXECUTOR_COUNT_BYTES:
        return count(data, policy.counter)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, count, data, policy.counter)


def sticky_key(headers: Mapping[str, str], policy: ActivePolicy, data: dict[str, Any], digest: str) -> str:
    """Session header, else the body's `user`, else the API key's digest."""
    session = headers.get(policy.spec.sticky.session_header)
    if session:
        return "s:" + session
    user = data.get("user")
    if policy.spec.sticky.use_user_field and isinstance(user, str) and user:
        return "u:" + user
    return "k:" + digest


def upstream_body(route: Route, alias: str, data: dict[str, Any], body: bytes) -> bytes:
    """The bytes to forward: the client's own, unless the route renames the model upstream (then the
    body is encoded again; one nested too deeply for that is a 400)."""
    if route.upstream_model is not None and route.upstream_model != alias:
        data["model"] = route.upstream_model
        try:
            return _dumps(data)
        except RecursionError:  # the stdlib encoder (orjson's limit is lower) ran out of stack
            raise Reject(
                400,
                "request body is nested too deeply to forward it with the model renamed",
                code="invalid_body",
            ) from None
    return body


async def admit(
    request: web.BaseRequest,
    policy: ActivePolicy,
    endpoint: Endpoint,
    rid: str,
    t0: float,
    m: GatewayMetrics,
    limiter: Limiter,
    deciding: Deciding,
) -> RequestContext:
    """Authenticate, limit, read, validate, classify and decide (`deciding`: the decider's live facts);
    count the decision (or the rejection).

    An admitted request is counted in flight for its key (and its key's slot for the alias when it has
    per_model limits): the caller releases both when the response ends (`ctx.key.name`, `ctx.model_slot`);
    a rejection here releases them itself.
    """
    alias = model = NO_MODEL
    held: str | None = None
    model_slot: str | None = None
    style: Style = "anthropic" if endpoint == "messages" else "openai"
    try:
        if endpoint == "messages":
            auth = permitted(authorize_anthropic(request.headers, policy), "client")
        else:
            auth = authorize(request.headers.get("Authorization"), policy)
        assert auth.entry is not None
        admit_key(limiter, auth.entry.name, m)
        held = auth.entry.name
        body = await read_body(request, policy.spec.max_body_bytes, policy.spec.clients.body_timeout_s)
        data = parse_body(body)
        alias, route = route_for(policy, data)
        model = route.model
        check_route_api(alias, route, endpoint)
        check_fields(endpoint, data)
        forced = forced_pool(request.headers, policy, route, endpoint)
        choice = forced_choice(request.headers, policy, route)
        on = forced_threshold(request.headers, policy, route)
        # the engine's own prompt (count, blocks), when the route renders it
        ids = await prompt_ids(route.tokenizer, data, endpoint, policy.spec.decider.block_tokens)
        tokens = ids.tokens if ids is not None else await count_tokens(policy, data, len(body), endpoint)
        check_prompt_limit(policy.limits, limiter, held, alias, tokens, endpoint)
        model_slot = admit_model(limiter, held, alias, m)
        body = upstream_body(route, alias, data, body)
    except Reject as rej:
        for name in (held, model_slot):
            if name is not None:
                limiter.release(name)
        if rej.code == "prompt_too_long":
            m.child(m.limit_rejections, held or "-", "prompt_tokens").inc()
        status = rej.status if style == "openai" else anthropic_status(rej.status)[0]
        m.child(m.requests, model, "none", "none", str(status)).inc()
        raise
    except BaseException:
        for name in (held, model_slot):
            if name is not None:
                limiter.release(name)
        raise
    key, digest = auth.entry, auth.digest
    assert key is not None and digest is not None  # authorize() raised otherwise
    sticky = sticky_key(request.headers, policy, data, digest)
    cls, decision = deciding.route(policy, route, data, endpoint, tokens, sticky, forced, choice, on, ids)
    if decision.reason == "endpoint_not_carried":
        m.child(m.kept_colocated, model, endpoint, "router_lacks_endpoint").inc()
    stage = route.staging.stage if route.staging is not None else NO_MODEL
    m.child(m.decisions, model, stage, cls, decision.pool, decision.legacy_reason).inc()
    m.child(m.prompt_tokens, model).observe(tokens)
    if decision.cached is not None:
        m.count_estimate(model, decision.pool, decision.candidate, tokens, decision.cached)
    policy.counts.count(model, cls, decision.pool)
    stream = bool(data.get("stream", False))
    return RequestContext(
        rid,
        t0,
        policy,
        key,
        endpoint,
        alias,
        route,
        data,
        body,
        stream,
        tokens,
        cls,
        decision,
        style,
        model_slot,
    )
