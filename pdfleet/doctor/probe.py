"""The client view's gatherer: call the base URL the way a script does, through the real OpenAI or Anthropic
SDK, and record every exchange (keys masked) as `ClientFacts` for the pure rules in `client_rules`.

Besides the SDK calls, two plain GETs at the URL's origin tell a gateway from a vLLM instance: the
gateway's /health is JSON naming its policy version, vLLM's is an empty 200 and vLLM answers /version.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx2

from pdfleet.doctor.exchange import Exchange, Recorder, by_probe
from pdfleet.errors import ValidationError

if TYPE_CHECKING:
    import openai

ANTHROPIC_ENV = ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN")
PROBE_TEXT = "Say hi."  # the one user message every probe sends
PROBE_MAX_TOKENS = 4
ANTHROPIC_VERSION = "2023-06-01"  # the anthropic-version header value Anthropic's API documents
# What a refused connection looks like in the SDK's and httpx2's messages, to say "refused" plainly.
REFUSED_MARKS = ("Connection refused", "Errno 111", "ECONNREFUSED")


@dataclass(frozen=True)
class KeyShape:
    """What can be said about a key without showing it: masked form, whitespace around it, header text."""

    var: str
    masked: str
    lead: str  # the whitespace before the key, as it is (' ', '\t', '\n')
    trail: str
    header_text: bool  # the variable holds `Bearer KEY` or `Authorization: ...`, not the key


@dataclass(frozen=True)
class ScriptCall:
    """The request a script makes, when the operator passes one: the path it posts to and its body."""

    endpoint: str  # relative to the base URL: chat/completions, completions, messages
    body: dict[str, Any]
    expects_stream: bool  # the script reads the answer as a stream


@dataclass(frozen=True)
class ClientFacts:
    """Everything the client rules read."""

    base_url: str
    anthropic: bool
    key: KeyShape | None
    exchanges: tuple[Exchange, ...]
    model: str | None = None  # the alias the probes asked for
    models: tuple[str, ...] = ()  # the aliases the base URL listed
    env: Mapping[str, str | None] = field(default_factory=dict)  # ANTHROPIC_* as seen (keys masked)
    script: ScriptCall | None = None

    def exchange(self, probe: str) -> Exchange | None:
        """The exchange of one probe (health, version, models, chat, chat_stream, messages, ...)."""
        return by_probe(self.exchanges).get(probe)


def key_shape(var: str, key: str) -> KeyShape:
    """The shape of the key in `var`: masked, the whitespace around it, whether it is header text."""
    from pdfleet.doctor.finding import mask_key

    core = key.strip()
    header_text = core.lower().startswith(("bearer ", "authorization:", "x-api-key:"))
    return KeyShape(
        var, mask_key(key), key[: len(key) - len(key.lstrip())], key[len(key.rstrip()) :], header_text
    )


def origin(url: str) -> str:
    """scheme://host:port of a URL."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _error_text(exc: BaseException) -> str:
    """A connection failure in one line, the underlying cause included ('Connection refused')."""
    texts = [str(exc)]
    cause = exc.__cause__ or exc.__context__
    while cause is not None and len(texts) < 4:
        text = f"{type(cause).__name__}: {cause}"
        if text not in texts:  # httpx2 wraps the same error at each layer
            texts.append(text)
        cause = cause.__cause__ or cause.__context__
    text = "; ".join(t for t in texts if t)
    if any(mark in text for mark in REFUSED_MARKS) and "refused" not in texts[0].lower():
        text = "connection refused; " + text
    return text


def _run(recorder: Recorder, probe: str, call: Callable[[], str]) -> Exchange | None:
    """One probe: run the SDK call, record what the SDK made of the answer."""
    recorder.probe = probe
    # The SDKs are imported when a probe runs, here and below: importing both takes ~5 s, which every
    # `invoke` command (its --help included) would otherwise pay.
    import anthropic
    import openai

    try:
        outcome = call()
    except (openai.APIStatusError, anthropic.APIStatusError) as exc:
        return recorder.finish(f"{type(exc).__name__}: {exc.message}")
    except (openai.APIConnectionError, anthropic.APIConnectionError, httpx2.HTTPError) as exc:
        return recorder.finish(f"{type(exc).__name__}", _error_text(exc))
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        # what a script reading the answer hits: KeyError 'choices', None has no attribute ...
        return recorder.finish(f"{type(exc).__name__}: {exc}")
    return recorder.finish(outcome)


def _get(client: httpx2.Client, url: str, headers: Mapping[str, str] | None = None) -> Callable[[], str]:
    """A plain GET (no SDK), as a probe call."""

    def call() -> str:
        return f"HTTP {client.get(url, headers=dict(headers or {})).status_code}"

    return call


def _listed(ex: Exchange | None) -> tuple[str, ...]:
    """The model ids of an OpenAI model list answer."""
    body = ex.body_json() if ex is not None and ex.status == 200 else None
    data = body.get("data") if isinstance(body, dict) else None
    return tuple(str(m.get("id")) for m in data if isinstance(m, dict)) if isinstance(data, list) else ()


def _reachable(ex: Exchange | None) -> bool:
    return ex is not None and ex.error is None


def gather_client_facts(
    base_url: str,
    key: str | None,
    key_var: str,
    use_anthropic: bool,
    environ: Mapping[str, str],
    model: str | None = None,
    script: ScriptCall | None = None,
    timeout: float = 10.0,
) -> ClientFacts:
    """Probe `base_url` as the SDK would and return what was seen. Sends only to `base_url`'s origin."""
    secrets = tuple(v for v in (key, *(environ.get(n) for n in ANTHROPIC_ENV[1:])) if v)
    recorder = Recorder(secrets)
    # an empty variable is an unset one, as the Anthropic SDK reads them (`os.environ.get(...) or None`)
    env = {n: (recorder.mask(environ[n]) if environ.get(n) else None) for n in ANTHROPIC_ENV}
    shape = key_shape(key_var, key) if key is not None else None
    # trust_env off: probes go to the URL asked, never through a proxy the environment names; the CAs
    # trusted are the SDK's (SSL_CERT_FILE/SSL_CERT_DIR, as its httpx2 client reads them)
    trust = sdk_trust(environ)
    with httpx2.Client(event_hooks=recorder.hooks(), timeout=timeout, trust_env=False, verify=trust) as http:
        root = origin(base_url)
        _run(recorder, "health", _get(http, root + "/health"))
        if not _reachable(by_probe(recorder.exchanges).get("health")):
            return ClientFacts(
                base_url, use_anthropic, shape, tuple(recorder.exchanges), model, (), env, script
            )
        _run(recorder, "version", _get(http, root + "/version"))
        if use_anthropic:
            models, model = _anthropic_probes(http, recorder, base_url, key, key_var, environ, model)
        else:
            models, model = _openai_probes(http, recorder, base_url, key or "", model, script)
    return ClientFacts(base_url, use_anthropic, shape, tuple(recorder.exchanges), model, models, env, script)


def sdk_trust(environ: Mapping[str, str]) -> ssl.SSLContext | bool:
    """The certificates the SDKs' HTTP client trusts in `environ`: SSL_CERT_FILE, else SSL_CERT_DIR, else the
    system's (True). ValidationError naming the variable when it names nothing loadable."""
    for var in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        if where := environ.get(var):
            try:
                if var == "SSL_CERT_FILE":
                    return ssl.create_default_context(cafile=where)
                return ssl.create_default_context(capath=where)
            except (OSError, ssl.SSLError) as exc:
                raise ValidationError(f"{var}={where}: no CA certificate loads from it ({exc})") from None
    return True


def _openai_probes(
    http: httpx2.Client,
    recorder: Recorder,
    base_url: str,
    key: str,
    model: str | None,
    script: ScriptCall | None,
) -> tuple[tuple[str, ...], str | None]:
    """GET models, then chat completions without and with streaming, then the script's own call."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=key, http_client=http, max_retries=0)
    models = _listed(_run(recorder, "models", lambda: f"{len(client.models.list().data)} models"))
    alias = model or (models[0] if models else None)
    if alias is None:
        return models, None

    def chat() -> str:
        done = client.chat.completions.create(
            model=alias, messages=[{"role": "user", "content": PROBE_TEXT}], max_tokens=PROBE_MAX_TOKENS
        )
        return f"choices[0].message.content = {done.choices[0].message.content!r}"

    def chat_stream() -> str:
        chunks = list(
            client.chat.completions.create(
                model=alias,
                messages=[{"role": "user", "content": PROBE_TEXT}],
                max_tokens=PROBE_MAX_TOKENS,
                stream=True,
            )
        )
        with_choices = sum(1 for c in chunks if getattr(c, "choices", None))
        return f"{len(chunks)} chunks, {with_choices} with choices"

    _run(recorder, "chat", chat)
    _run(recorder, "chat_stream", chat_stream)
    if script is not None:
        _run(recorder, "script", _script_call(client, script))
    return models, alias


def _script_call(client: openai.OpenAI, script: ScriptCall) -> Callable[[], str]:
    """POST the script's body to the script's endpoint through the SDK's URL handling, then read it as a
    script does: `choices` of the JSON answer."""

    def call() -> str:
        resp = client.post("/" + script.endpoint.lstrip("/"), cast_to=httpx2.Response, body=script.body)
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            return "a stream of server-sent events"
        answer = json.loads(resp.text)
        return f"{len(answer['choices'])} choices"

    return call


def _anthropic_probes(
    http: httpx2.Client,
    recorder: Recorder,
    base_url: str,
    key: str | None,
    key_var: str,
    environ: Mapping[str, str],
    model: str | None,
) -> tuple[tuple[str, ...], str | None]:
    """The gateway's alias list (Bearer), then /v1/messages without and with streaming through the SDK."""
    api_key = key if key_var != "ANTHROPIC_AUTH_TOKEN" else None
    token = key if key_var == "ANTHROPIC_AUTH_TOKEN" else None
    if api_key is None and token is None:
        api_key, token = environ.get("ANTHROPIC_API_KEY") or None, environ.get("ANTHROPIC_AUTH_TOKEN") or None
    bearer = api_key or token
    models: tuple[str, ...] = ()
    if bearer is not None:
        url = base_url.rstrip("/") + "/v1/models"
        models = _listed(_run(recorder, "models", _get(http, url, {"Authorization": f"Bearer {bearer}"})))
    alias = model or (models[0] if models else None)
    if alias is None or bearer is None:
        return models, alias
    creds = {"api_key": api_key} if api_key is not None else {"auth_token": token}
    from anthropic import Anthropic

    client = Anthropic(base_url=base_url, http_client=http, max_retries=0, **creds)

    def messages() -> str:
        msg = client.messages.create(
            model=alias, max_tokens=PROBE_MAX_TOKENS, messages=[{"role": "user", "content": PROBE_TEXT}]
        )
        # read as a script reads it: a first block that is not text raises the AttributeError _run reports
        return f"content[0].text = {msg.content[0].text!r}"  # type: ignore[union-attr]  # on purpose, above

    def messages_stream() -> str:
        with client.messages.stream(
            model=alias, max_tokens=PROBE_MAX_TOKENS, messages=[{"role": "user", "content": PROBE_TEXT}]
        ) as s:
            text = "".join(s.text_stream)
        return f"streamed text {text!r}"

    def messages_x_api_key() -> str:
        # older Anthropic SDKs and Claude Code send the key as x-api-key, not as a Bearer token
        resp = http.post(
            base_url.rstrip("/") + "/v1/messages",
            json={
                "model": alias,
                "max_tokens": PROBE_MAX_TOKENS,
                "messages": [{"role": "user", "content": PROBE_TEXT}],
            },
            headers={"x-api-key": bearer, "anthropic-version": ANTHROPIC_VERSION},
        )
        return f"HTTP {resp.status_code}"

    _run(recorder, "messages", messages)
    _run(recorder, "messages_stream", messages_stream)
    _run(recorder, "messages_x_api_key", messages_x_api_key)
    return models, alias
