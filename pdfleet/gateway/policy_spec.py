"""The gateway policy file's schema (pydantic, unknown keys are errors) and the checks that span keys:
each alias has pools or an outside endpoint, its group exists, each group's stage is one of its stages.

The policy's format is described in pdfleet.gateway.policy, its one reader and writer.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from yarl import URL

from pdfleet.gateway.outside import OutsideSpec
from pdfleet.model.limits import LimitsSpec
from pdfleet.model.routing import DeciderSpec
from pdfleet.model.shadowing import CaptureSpec, ShadowSpec
from pdfleet.model.stages import StageSpec
from pdfleet.model.vllm_kv_events import FORMATS, event_format
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

EndpointName = Literal["chat", "completions", "messages"]
# What a P/D pool carries by default. vllm-router 0.1.17 forwards /v1/messages in P/D mode too (prefill
# leg max_tokens=1 with kv_transfer_params, then decode), but vLLM's Messages route ignores
# kv_transfer_params before vLLM PR #37535 (2026-03): there the decode instance silently redoes the
# whole prefill. A fleet on a vLLM with it can add "messages" to a route's disagg_endpoints.
ROUTER_PD_ENDPOINTS: tuple[EndpointName, ...] = ("chat", "completions")


def _base_url(value: str) -> str:
    """A server root URL (http/https, host, no path), normalised without a trailing slash."""
    url = URL(value)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"{value!r} is not an http(s) URL with a host (e.g. http://10.0.0.11:8000)")
    if url.path not in ("", "/") or url.query_string or url.fragment:
        raise ValueError(
            f"{value!r} has a path; give the server root (e.g. http://10.0.0.11:8000), "
            "the gateway appends /v1/..."
        )
    return str(url.with_path("")).rstrip("/")


BaseUrl = Annotated[str, AfterValidator(_base_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TlsSpec(_Strict):
    """TLS on every listener: the certificate (chain, PEM) and its private key (PEM, mode 0600); a path
    not absolute is relative to the policy file's directory. A reload reads both again."""

    cert_file: str = Field(min_length=1)
    key_file: str = Field(min_length=1)


class ListenSpec(_Strict):
    """Where the gateway listens; admin endpoints move to `admin_port` when it is set; with `tls`, both
    listeners speak HTTPS only (None: plain HTTP, which the profile must ask for)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)  # 0: any free port (tests)
    admin_port: int | None = Field(None, ge=0, le=65535)
    tls: TlsSpec | None = None


class EstimatorSpec(_Strict):
    """Prompt-token estimator: the model's tokenizer.json when given, else characters per token."""

    tokenizer: str | None = None
    chars_per_token: float = Field(DEFAULT_CHARS_PER_TOKEN, gt=0, le=64)


class TimeoutSpec(_Strict):
    """Upstream timeouts in seconds; `first_byte_s` covers connect, headers and the first chunk."""

    connect_s: float = Field(5.0, gt=0)
    first_byte_s: float = Field(300.0, gt=0)
    idle_s: float = Field(300.0, gt=0)


class ClientSpec(_Strict):
    """Bounds on the gateway's own clients: how long a request head, a request body and an idle
    keep-alive connection may take, and how many connections one client address may hold.

    The idle default outlasts a 60 s load-balancer idle timeout, so the balancer closes first and never
    races the gateway's close; the connection cap is high because a balancer or NAT puts many clients
    behind one address. A reload applies to connections accepted (and bodies read) after it.
    """

    header_timeout_s: float = Field(10.0, gt=0)  # first byte of a request head to its blank line
    body_timeout_s: float = Field(60.0, gt=0)  # end of the head to the end of the body
    idle_timeout_s: float = Field(75.0, gt=0)  # keep-alive: a connection with no request is closed
    max_connections_per_address: int = Field(4096, ge=1)


class StickySpec(_Strict):
    """Where the sticky routing key comes from: session header, then the body's `user`, then the API key."""

    session_header: str = Field("X-Session-Id", min_length=1)
    use_user_field: bool = True


class GroupSpec(_Strict):
    """A model group (a pdfleet model): its own stage, stages and long-prompt threshold, each defaulting
    to the policy's top-level one."""

    stage: str | None = Field(None, min_length=1)
    stages: dict[str, StageSpec] | None = Field(None, min_length=1)
    long_prompt_tokens: int | None = Field(None, ge=1)


class ModelRoute(_Strict):
    """One model alias: its colocated base URLs, its disaggregated (vllm-router) URL, its upstream name,
    its group; or, instead of pools, an outside endpoint."""

    colocated: list[BaseUrl] = []
    disagg: BaseUrl | None = None
    upstream_model: str | None = Field(None, min_length=1)
    # the endpoints the disagg pool (vllm-router in P/D mode) carries; the others stay colocated
    disagg_endpoints: tuple[EndpointName, ...] = ROUTER_PD_ENDPOINTS
    group: str | None = Field(None, min_length=1, max_length=64)
    outside: OutsideSpec | None = None
    # the P/D pool's vLLM instances, scraped for their queues when the decider has a bypass bound
    prefill: list[BaseUrl] = []
    decode: list[BaseUrl] = []
    # the colocated instances' KV-events publishers (tcp://HOST:PORT, in `colocated`'s order) and the vLLM
    # release whose event format they publish: the decider's cache facts for this alias come from them
    kv_events: list[str] = []
    kv_events_release: str | None = Field(None, min_length=1)
    # the P/D pool's prefill instances' publishers (in `prefill`'s order): the P/D candidate's cache facts,
    # their largest figure when vllm-router picks the prefill instance by prefix (cache_aware), else their
    # mean (round robin and the other policies spread a prompt over them)
    prefill_kv_events: list[str] = []
    prefill_cache_aware: bool = False
    # the model's tokenizer directory (tokenizer.json and its chat template): chat prompts become the
    # engine's token ids, which KV events carry (pdfleet.gateway.prompt_ids)
    tokenizer: str | None = Field(None, min_length=1)
    # the colocated instances' KV-events replay sockets (tcp://HOST:PORT, in kv_events' order: vLLM's
    # replay_endpoint): a sequence gap asks for the missed batches there before forgetting the instance
    kv_events_replay: list[str] = []
    # the prefill instances' replay sockets (in prefill_kv_events' order), likewise
    prefill_kv_events_replay: list[str] = []


class PolicySpec(_Strict):
    """The whole policy file."""

    version: int = Field(ge=1)
    listen: ListenSpec = ListenSpec()
    keys_file: str = Field(min_length=1)
    groups: dict[str, GroupSpec] = {}
    models: dict[str, ModelRoute] = Field(min_length=1)
    estimator: EstimatorSpec = EstimatorSpec()
    long_prompt_tokens: int = Field(8192, ge=1)
    stage: str = Field(min_length=1)
    stages: dict[str, StageSpec] = Field(min_length=1)
    sticky: StickySpec = StickySpec()
    override_header: str | None = Field("X-Pdfleet-Pool", min_length=1)
    stall_threshold_ms: float = Field(500.0, gt=0)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    timeouts: TimeoutSpec = TimeoutSpec()
    clients: ClientSpec = ClientSpec()
    limits: LimitsSpec = LimitsSpec()
    log_requests: bool = True
    decider: DeciderSpec = DeciderSpec()
    shadow: ShadowSpec = ShadowSpec()
    capture: CaptureSpec = CaptureSpec()


def route_problems(spec: PolicySpec, alias: str, route: ModelRoute) -> list[str]:
    """What is wrong with one alias: pools or an outside endpoint (not both, not neither), its group."""
    if route.outside is not None:
        pool_keys = ("colocated", "disagg", "disagg_endpoints", "group", "prefill", "decode", "kv_events")
        extra = [k for k in pool_keys if k in route.model_fields_set]
        if extra:
            return [f"{k}: an outside alias has no pools, P/D or group; remove {k}" for k in extra]
        return []
    if not route.colocated:
        return ["colocated: give at least one colocated base URL (or outside: for an outside endpoint)"]
    if route.group is not None and route.group not in spec.groups:
        known = ", ".join(spec.groups) or "none"
        return [f"group: {route.group!r} is not under groups: (groups: {known})"]
    if route.group is None and alias in spec.groups:
        return [f"group: the alias is named like group {alias!r}; set group: {alias} (or rename one)"]
    return _bypass_problems(spec.decider, route) + _kv_events_problems(route)


def _kv_events_problems(route: ModelRoute) -> list[str]:
    """One publisher per colocated instance, each tcp://HOST:PORT, of a release whose format is tabled;
    the prefill instances' likewise, beside them."""
    if not route.kv_events:
        beside = ("prefill_kv_events", "kv_events_replay", "prefill_kv_events_replay")
        for key in beside:
            if getattr(route, key):
                return [f"{key}: set only with kv_events (the colocated instances' publishers)"]
        return ["kv_events_release: set only with kv_events"] if route.kv_events_release else []
    if len(route.kv_events) != len(route.colocated):
        return [
            f"kv_events: {len(route.kv_events)} endpoints for {len(route.colocated)} colocated instances; "
            "list one per colocated instance, in the same order"
        ]
    problems = [
        f"kv_events[{i}]: {e!r} is not tcp://HOST:PORT" for i, e in enumerate(route.kv_events) if not _tcp(e)
    ]
    if route.prefill_kv_events and len(route.prefill_kv_events) != len(route.prefill):
        problems.append(
            f"prefill_kv_events: {len(route.prefill_kv_events)} endpoints for {len(route.prefill)} prefill "
            "instances; list the P/D pool's prefill base URLs under prefill, one publisher each, in order"
        )
    problems += [
        f"prefill_kv_events[{i}]: {e!r} is not tcp://HOST:PORT"
        for i, e in enumerate(route.prefill_kv_events)
        if not _tcp(e)
    ]
    if route.kv_events_replay and len(route.kv_events_replay) != len(route.kv_events):
        problems.append(
            f"kv_events_replay: {len(route.kv_events_replay)} endpoints for {len(route.kv_events)} kv_events"
        )
    if route.prefill_kv_events_replay and len(route.prefill_kv_events_replay) != len(route.prefill_kv_events):
        problems.append(
            f"prefill_kv_events_replay: {len(route.prefill_kv_events_replay)} endpoints for "
            f"{len(route.prefill_kv_events)} prefill_kv_events"
        )
    for key in ("kv_events_replay", "prefill_kv_events_replay"):
        problems += [
            f"{key}[{i}]: {e!r} is not tcp://HOST:PORT"
            for i, e in enumerate(getattr(route, key))
            if not _tcp(e)
        ]
    if route.kv_events_release is None or event_format(route.kv_events_release) is None:
        tabled = ", ".join(FORMATS)
        problems.append(
            f"kv_events_release: {route.kv_events_release!r}: give the vLLM release the instances run "
            f"(KV event formats tabled: {tabled})"
        )
    return problems


def _tcp(endpoint: str) -> bool:
    """tcp://HOST:PORT with a port number."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    return scheme == "tcp" and bool(host) and port.isdigit() and 0 < int(port) < 65536


def _bypass_problems(decider: DeciderSpec, route: ModelRoute) -> list[str]:
    """A bypass bound needs the P/D pool's instances to scrape (else its queue is never known)."""
    if route.disagg is None:
        return []
    problems = []
    for side, bound in (("prefill", decider.prefill_busy_waiting), ("decode", decider.decode_busy_waiting)):
        if bound is not None and not getattr(route, side):
            problems.append(
                f"{side}: decider.{side}_busy_waiting is set but this alias lists no {side} instance to "
                f"scrape; list the P/D pool's {side} base URLs (e.g. http://10.0.0.12:8100)"
            )
    return problems


def group_problems(spec: PolicySpec) -> list[str]:
    """What is wrong with the groups: a stage not among its stages, a group no alias names (and a
    policy-wide cache source: in a policy, each alias lists its KV-events publishers)."""
    problems = []
    if spec.decider.cache_source != "index":
        problems.append(
            "decider.cache_source: a policy takes KV events per alias; list each alias's kv_events "
            "endpoints and kv_events_release instead (remove the key)"
        )
    if spec.decider.tokenizer != "estimate":
        problems.append(
            "decider.tokenizer: a policy names each alias's tokenizer directory (models.ALIAS.tokenizer: "
            "DIR) instead (remove the key)"
        )
    named = {r.group for r in spec.models.values()}
    for name, group in spec.groups.items():
        stages = group.stages if group.stages is not None else spec.stages
        stage = group.stage if group.stage is not None else spec.stage
        if stage not in stages:
            problems.append(f"groups.{name}.stage: {stage!r} is not a stage; stages are: {', '.join(stages)}")
        if name not in named:
            problems.append(f"groups.{name}: no alias under models: names this group (group: {name})")
    return problems
