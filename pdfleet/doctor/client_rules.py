"""The client view's catalogue: one pure rule per failure a script hits, over `ClientFacts`.

401 forms (whitespace around the key, header text in the key variable, a key that is not the gateway's,
vLLM's own key check), a base URL with a path or query or without /v1, a base URL at a pool instance
instead of the gateway, no connection, the wrong endpoint for the body (KeyError 'choices'), an alias
with no route, stream vs non-stream. The Anthropic rules are in `anthropic_rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from pdfleet.doctor.exchange import Exchange
from pdfleet.doctor.finding import Finding
from pdfleet.doctor.probe import ClientFacts
from pdfleet.model.profile import GatewaySpec

ENDPOINTS = ("chat/completions", "completions", "messages", "models", "embeddings")
SDK_CALL = {"chat/completions": "client.chat.completions.create", "completions": "client.completions.create"}
# the profile's default gateway port, read from the model (the one place a default port is written)
GATEWAY_DEFAULT_PORT = GatewaySpec.model_fields["port"].default
GATEWAY_FIX_URL = f"http://<gateway host>:<gateway.port: {GATEWAY_DEFAULT_PORT} by default>"
ClientRule = Callable[[ClientFacts], list[Finding]]


def _strip(text: str) -> str:
    return text.strip().strip("/")


def base_url_problems(url: str, anthropic: bool) -> list[str]:
    """What is wrong with a base URL's shape, for the SDK that takes it (pure, from the URL alone)."""
    parts = urlsplit(url)
    problems = []
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"{url!r} is not an http(s) URL with a host"]
    if parts.query or parts.fragment:
        problems.append(
            "it carries a query string or fragment: the SDK appends the endpoint after it, so "
            "the request goes to the wrong path"
        )
    path = _strip(parts.path)
    ending = next((e for e in ENDPOINTS if path == e or path.endswith("/" + e)), None)
    if ending:
        problems.append(f"its path ends with the endpoint {ending!r}: the SDK appends the endpoint itself")
    elif anthropic and (path == "v1" or path.endswith("/v1")):
        problems.append("it ends with /v1: the Anthropic SDK appends /v1/messages itself")
    elif not anthropic and not (path == "v1" or path.endswith("/v1")):
        problems.append(
            "it does not end with /v1: the OpenAI SDK appends /chat/completions to the base URL "
            "and the gateway serves /v1/chat/completions"
        )
    return problems


def suggested_base_url(url: str, anthropic: bool) -> str:
    """The base URL the SDK wants: no query, no endpoint at the end, then `.../v1` (OpenAI) or without
    it (Anthropic); a path prefix before them (a reverse proxy's) is kept."""
    parts = urlsplit(url)
    path = _strip(parts.path)
    ending = next((e for e in ENDPOINTS if path == e or path.endswith("/" + e)), None)
    if ending:
        path = _strip(path[: -len(ending)])
    if path == "v1" or path.endswith("/v1"):
        path = _strip(path[:-2])
    prefix = f"/{path}" if path else ""
    return f"{parts.scheme}://{parts.netloc}{prefix}" + ("" if anthropic else "/v1")


def rule_base_url(facts: ClientFacts) -> list[Finding]:
    """A base URL with a path or query appended, or without /v1 (OpenAI) / with /v1 (Anthropic)."""
    problems = base_url_problems(facts.base_url, facts.anthropic)
    if not problems:
        return []
    seen = [e for e in facts.exchanges if e.probe in ("models", "chat", "messages") and e.status is not None]
    evidence = "\n".join([f"base URL {facts.base_url}", *(e.evidence() for e in seen[:1])])
    var = "ANTHROPIC_BASE_URL" if facts.anthropic else "base_url (OPENAI_BASE_URL)"
    return [
        Finding(
            "client.base_url",
            "error",
            f"the base URL is wrong: {'; '.join(problems)}",
            evidence,
            f"set {var} to {suggested_base_url(facts.base_url, facts.anthropic)}",
            subject=facts.base_url,
        )
    ]


def rule_key_whitespace(facts: ClientFacts) -> list[Finding]:
    """Whitespace around the key: the gateway compares keys exactly, and HTTP clients refuse a header
    that ends in a newline."""
    key = facts.key
    if key is None or not (key.lead or key.trail):
        return []
    sent = next(
        (e for e in facts.exchanges if e.request_headers and e.probe not in ("health", "version")), None
    )
    evidence = (
        f"${key.var} = '{key.masked}' ({len(key.lead)} leading, {len(key.trail)} trailing whitespace "
        "characters; ⎵ is a space)" + (f"\n{sent.evidence()}" if sent else "")
    )
    return [
        Finding(
            "client.key_whitespace",
            "error",
            f"the API key in {key.var} has whitespace around it",
            evidence,
            f'strip it: export {key.var}="$(printf %s "${key.var}" | tr -d \'[:space:]\')" '
            "(a key file read with `cat` keeps its newline)",
            subject=key.var,
        )
    ]


def rule_key_header_text(facts: ClientFacts) -> list[Finding]:
    """The variable holds `Bearer KEY` (or a whole header): the SDK sends `Bearer Bearer KEY`."""
    key = facts.key
    if key is None or not key.header_text:
        return []
    sent = next((e for e in facts.exchanges if e.status == 401), None)
    evidence = f"${key.var} = '{key.masked}'" + (f"\n{sent.evidence()}" if sent else "")
    return [
        Finding(
            "client.auth_header",
            "error",
            f"{key.var} holds header text, not the key: the header sent is not 'Bearer KEY'",
            evidence,
            f"put only the key in {key.var}; the SDK adds 'Authorization: Bearer ' itself",
            subject=key.var,
        )
    ]


def _vllm_identity(facts: ClientFacts) -> str | None:
    """Why the server answering is a vLLM instance (or pdfleet-sim), not the gateway; None if it is not."""
    health, version = facts.exchange("health"), facts.exchange("version")
    if health is None or health.status is None:
        return None
    body = health.body_json()
    if isinstance(body, dict) and "policy_version" in body:
        return None  # the gateway's own /health
    reasons = []
    if health.status == 200 and not health.response_body.strip():
        reasons.append("/health answers an empty 200 (vLLM's; the gateway's names its policy_version)")
    if version is not None and version.status == 200 and _is_vllm_version(version.body_json()):
        reasons.append(
            f"/version answers {version.response_body.strip()[:80]} (vLLM's server version endpoint)"
        )
    models = facts.exchange("models")
    mbody = models.body_json() if models is not None else None
    if isinstance(mbody, dict) and any(
        isinstance(m, dict) and m.get("owned_by") == "vllm" for m in mbody.get("data") or []
    ):
        reasons.append("/v1/models lists models owned_by 'vllm'")
    return "; ".join(reasons) or None


def _is_vllm_version(body: object) -> bool:
    """Whether a /version body is vLLM's `{"version": ...}`."""
    return isinstance(body, dict) and "version" in body


def rule_pool_port(facts: ClientFacts) -> list[Finding]:
    """The base URL points at a pool instance's port (vLLM or the simulator), not at the gateway."""
    why = _vllm_identity(facts)
    if why is None:
        return []
    port = urlsplit(facts.base_url).port
    unauthorized = next((e for e in facts.exchanges if e.status == 401), None)
    what = f"the base URL points at a vLLM pool instance (port {port}), not at the gateway"
    if unauthorized is not None:
        what += "; its 401 is vLLM's own --api-key check, which knows nothing of the gateway's keys"
    evidence = why + "".join(f"\n{e.evidence()}" for e in (facts.exchange("health"), unauthorized) if e)
    return [
        Finding(
            "client.pool_port",
            "error",
            what,
            evidence,
            f"point at the gateway: base URL {GATEWAY_FIX_URL}{'' if facts.anthropic else '/v1'}, "
            "with the gateway's client key (gateway.client_key_file); pool ports take no client traffic",
            subject=facts.base_url,
        )
    ]


def rule_unreachable(facts: ClientFacts) -> list[Finding]:
    """No connection at all: refused (nothing listens there) or unreachable / timed out."""
    first = facts.exchanges[0] if facts.exchanges else None
    if first is None or first.error is None:
        return []
    refused = "refused" in first.error.lower()
    what = (
        "connection refused: nothing listens at " if refused else "the base URL is not reachable: "
    ) + f"{urlsplit(facts.base_url).netloc}"
    fix = (
        f"check the port: the gateway listens on gateway.port ({GATEWAY_DEFAULT_PORT} by default) of the "
        "gateway host; "
        "`systemctl status pdfleet-gateway` there"
        if refused
        else "check the address and the route from this machine to the gateway host (firewall, VPN, proxy)"
    )
    return [Finding("client.unreachable", "error", what, first.evidence(), fix, subject=facts.base_url)]


def _rejected(ex: Exchange | None) -> bool:
    return ex is not None and ex.status == 401


def rule_invalid_key(facts: ClientFacts) -> list[Finding]:
    """A well-formed key the gateway does not know (another gateway's, a vLLM --api-key, a stale one)."""
    if facts.anthropic or facts.key is None or facts.key.lead or facts.key.trail or facts.key.header_text:
        return []  # anthropic_rules.rule_anthropic_auth speaks for /v1/messages
    if _vllm_identity(facts) is not None:
        return []  # rule_pool_port says why
    ex = next((e for e in facts.exchanges if _rejected(e)), None)
    if ex is None:
        return []
    return [
        Finding(
            "client.invalid_key",
            "error",
            f"the gateway refuses the key in {facts.key.var}: {ex.error_message() or 'HTTP 401'}",
            ex.evidence(),
            "use the gateway's client key: the file gateway.client_key_file names on the control machine "
            "(~/.config/pdfleet/gateway-client.key), not a vLLM instance's --api-key",
            subject=facts.key.var,
        )
    ]


def _script_kind(body: dict[str, object]) -> str | None:
    """Which endpoint a body is for: `messages` → chat/completions, `prompt` → completions."""
    if "messages" in body:
        return "chat/completions"
    if "prompt" in body:
        return "completions"
    return None


def rule_wrong_endpoint(facts: ClientFacts) -> list[Finding]:
    """The script posts a chat body to /v1/completions (or a prompt to /v1/chat/completions): the answer is
    an error object without `choices`, hence KeyError 'choices'."""
    script = facts.script
    if script is None or facts.anthropic:
        return []
    want = _script_kind(script.body)
    have = _strip(script.endpoint)
    posted = (
        "chat/completions"
        if have.endswith("chat/completions")
        else "completions"
        if have.endswith("completions")
        else None
    )
    if want is None or posted is None or posted == want:
        return []
    ex = facts.exchange("script")
    field = "messages" if want == "chat/completions" else "prompt"
    return [
        Finding(
            "client.wrong_endpoint",
            "error",
            f"the body has '{field}' (a /v1/{want} body) but goes to /v1/{have}: the answer has no "
            "'choices' (KeyError 'choices')",
            ex.evidence() if ex else f"POST {have}",
            f"post it to {{base_url}}/{want} ({SDK_CALL[want]}), or send the other endpoint's body",
            subject=have,
        )
    ]


def rule_no_choices(facts: ClientFacts) -> list[Finding]:
    """A 200 chat answer without `choices`: something other than an OpenAI server answers."""
    out = []
    for probe in ("chat",):
        ex = facts.exchange(probe)
        if ex is None or ex.status != 200 or ex.is_sse:
            continue  # no answer, or not a JSON 200: other rules speak for those
        body = ex.body_json()
        if isinstance(body, dict) and "choices" not in body:
            out.append(
                Finding(
                    "client.no_choices",
                    "error",
                    "a 200 answer to chat completions has no 'choices'",
                    ex.evidence(),
                    f"point the base URL at the gateway's OpenAI API ({GATEWAY_FIX_URL}/v1)",
                    subject=facts.base_url,
                )
            )
    return out


def rule_model_route(facts: ClientFacts) -> list[Finding]:
    """The alias asked for has no route (the gateway's 404 model_not_found, vLLM's 404 for a model)."""
    probes = ("messages", "messages_x_api_key") if facts.anthropic else ("chat", "chat_stream", "script")
    ex = next(
        (
            e
            for p in probes
            if (e := facts.exchange(p)) is not None
            and e.status == 404
            and ("model" in e.error_message().lower() or e.error_code() == "model_not_found")
        ),
        None,
    )
    if ex is None:
        return []
    listed = ", ".join(facts.models) or "none listed"
    what = f"the model alias {facts.model!r} has no route here"
    if facts.anthropic:
        what += " (or this key has no access to it)"
    return [
        Finding(
            "client.model_route",
            "error",
            what,
            ex.evidence(),
            f"use an alias the gateway routes ({listed}), or add one: gateway.model_alias in the profile, "
            "then `invoke provision --profile P --roles gateway`",
            subject=str(facts.model),
        )
    ]


def _stream_problem(ex: Exchange | None, want_stream: bool) -> Exchange | None:
    """The exchange when it answered 200 in the other framing than asked; None otherwise (or no answer)."""
    return ex if ex is not None and ex.status == 200 and ex.is_sse != want_stream else None


def rule_stream_mismatch(facts: ClientFacts) -> list[Finding]:
    """A stream where the client reads one JSON answer, or one JSON answer where it reads a stream."""
    out = []
    for probe, want in (
        ("chat", False),
        ("chat_stream", True),
        ("messages", False),
        ("messages_stream", True),
    ):
        ex = _stream_problem(facts.exchange(probe), want)
        if ex is not None:
            got = "a server-sent event stream" if ex.is_sse else "one JSON body"
            out.append(
                Finding(
                    "client.stream_mismatch",
                    "error",
                    f"asked {'with' if want else 'without'} stream, the base URL answered {got}",
                    ex.evidence(),
                    "point the base URL at the gateway, which relays what the pool "
                    "streams; a proxy in between must not buffer or re-frame",
                    subject=probe,
                )
            )
    script = facts.script
    if script is not None and bool(script.body.get("stream")) != script.expects_stream:
        sends = "stream: true" if script.body.get("stream") else "no stream: true"
        reads = "a stream" if script.expects_stream else "one JSON answer"
        fix = (
            'add "stream": true to the body' if script.expects_stream else 'drop "stream": true from the body'
        )
        ex = facts.exchange("script")
        out.append(
            Finding(
                "client.stream_mismatch",
                "error",
                f"the body sends {sends} but the script reads {reads}",
                ex.evidence() if ex else "",
                f"{fix} (stream=True in the SDK call)",
                subject="script",
            )
        )
    return out


CLIENT_RULES: tuple[ClientRule, ...] = (
    rule_unreachable,
    rule_base_url,
    rule_key_whitespace,
    rule_key_header_text,
    rule_pool_port,
    rule_invalid_key,
    rule_model_route,
    rule_wrong_endpoint,
    rule_no_choices,
    rule_stream_mismatch,
)
