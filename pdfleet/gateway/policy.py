"""The gateway's policy file: schema, validation, reading and writing it, and the pure routing decision
built from it.

A policy file is YAML validated by pydantic (unknown keys are errors; every error names the file and
the key path). Loading yields an immutable `ActivePolicy`; a reload builds a new one and swaps the
reference, so a request keeps the policy it started with until it ends. This module is the one reader
and writer of policy files: the gateway role renders through `policy_text`, `POST /admin/stage` rewrites
through `with_stage` and `write_policy`, the bench's loopback gateways write through `write_policy`, and
every reader (the gateway, provision's live-stage rule) parses through `parse_policy`.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError
from yarl import URL

from pdfleet.errors import ValidationError
from pdfleet.gateway.keys import KeyEntry, load_keys
from pdfleet.gateway.limits import LimitsSpec, check_limit_names
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.stages import LENGTH_CLASSES, StageSpec
from pdfleet.model.yamlfile import parse_yaml
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN, TextCounter, make_counter

POOLS: tuple[str, ...] = ("colocated", "disagg")
BUCKETS = 100
ENDPOINTS: tuple[str, ...] = ("chat", "completions", "messages")
# What a P/D pool carries by default. vllm-router 0.1.17 forwards /v1/messages in P/D mode too (prefill
# leg max_tokens=1 with kv_transfer_params, then decode), but vLLM's Messages route ignores
# kv_transfer_params before vLLM PR #37535 (2026-03): there the decode instance silently redoes the
# whole prefill. A fleet on a vLLM with it can add "messages" to a route's disagg_endpoints.
Pool = Literal["colocated", "disagg"]
LengthClass = Literal["short", "long"]
EndpointName = Literal["chat", "completions", "messages"]
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


class ListenSpec(_Strict):
    """Where the gateway listens; admin endpoints move to `admin_port` when it is set."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)  # 0: any free port (tests)
    admin_port: int | None = Field(None, ge=0, le=65535)


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


class ModelRoute(_Strict):
    """One model alias: its colocated base URLs, its disaggregated (vllm-router) URL, its upstream name."""

    colocated: list[BaseUrl] = Field(min_length=1)
    disagg: BaseUrl | None = None
    upstream_model: str | None = Field(None, min_length=1)
    # the endpoints the disagg pool (vllm-router in P/D mode) carries; the others stay colocated
    disagg_endpoints: tuple[EndpointName, ...] = ROUTER_PD_ENDPOINTS


class PolicySpec(_Strict):
    """The whole policy file."""

    version: int = Field(ge=1)
    listen: ListenSpec = ListenSpec()
    keys_file: str = Field(min_length=1)
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


@dataclass(frozen=True)
class Route:
    """A compiled model alias: pools as URL tuples plus a round-robin over the colocated ones."""

    alias: str
    colocated: tuple[str, ...]
    disagg: str | None
    upstream_model: str | None
    _rr: Iterator[int] = field(compare=False, repr=False)
    disagg_endpoints: frozenset[str] = frozenset(ROUTER_PD_ENDPOINTS)

    def next_colocated(self) -> tuple[str, str | None]:
        """The next colocated URL and, when there is another one, the one to retry on."""
        i = next(self._rr)
        n = len(self.colocated)
        return self.colocated[i % n], (self.colocated[(i + 1) % n] if n > 1 else None)


@dataclass(frozen=True)
class Decision:
    """Which pool a request goes to and why (weight, header, no-disagg)."""

    pool: Pool
    reason: str
    bucket: int


@dataclass
class PolicyCounts:
    """Counts since this policy became active (shown by /admin/policy)."""

    requests: int = 0
    in_flight: int = 0
    decisions: dict[str, dict[str, int]] = field(
        default_factory=lambda: {c: {p: 0 for p in POOLS} for c in LENGTH_CLASSES}
    )
    fallbacks: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ActivePolicy:
    """A loaded, validated policy: everything a request needs, never mutated except its counts."""

    spec: PolicySpec
    source: Path
    sha256: str
    keys: Mapping[str, KeyEntry]
    routes: Mapping[str, Route]
    counter: TextCounter
    loaded_at: float
    counts: PolicyCounts

    @property
    def stage(self) -> StageSpec:
        """The active stage's percentages."""
        return self.spec.stages[self.spec.stage]

    def summary(self) -> dict[str, Any]:
        """What /admin/policy shows: version, stage, pools per alias and counts (never key hashes)."""
        return {
            "version": self.spec.version,
            "source": str(self.source),
            "sha256": self.sha256,
            "loaded_at": self.loaded_at,
            "stage": self.spec.stage,
            "stage_percent_disagg": self.stage.model_dump(),
            "stages": {k: v.model_dump() for k, v in self.spec.stages.items()},
            "long_prompt_tokens": self.spec.long_prompt_tokens,
            "estimator": "tokenizer" if self.spec.estimator.tokenizer else "chars_per_token",
            "models": {
                a: {
                    "colocated": list(r.colocated),
                    "disagg": r.disagg,
                    "upstream_model": r.upstream_model,
                    "disagg_endpoints": sorted(r.disagg_endpoints),
                }
                for a, r in self.routes.items()
            },
            "keys": len(self.keys),
            "counts": {
                "requests": self.counts.requests,
                "in_flight": self.counts.in_flight,
                "decisions": self.counts.decisions,
                "fallbacks": self.counts.fallbacks,
            },
        }


def bucket_of(sticky_key: str) -> int:
    """Stable bucket 0..99 of a sticky key, so one conversation always lands in the same bucket."""
    digest = hashlib.sha256(sticky_key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def length_class(prompt_tokens: int, long_prompt_tokens: int) -> LengthClass:
    """`long` when the prompt has at least the threshold's tokens."""
    return "long" if prompt_tokens >= long_prompt_tokens else "short"


def decide(
    stage: StageSpec, cls: LengthClass, sticky_key: str, has_disagg: bool, forced: Pool | None = None
) -> Decision:
    """The pool for one request: forced by header, else bucket < stage percentage → disagg.

    Raising a class's percentage only ever moves buckets from colocated to disagg, so a ramp never
    moves a conversation back and forth.
    """
    bucket = bucket_of(sticky_key)
    if forced is not None:
        return Decision(forced, "header", bucket)
    if bucket < getattr(stage, cls):
        if has_disagg:
            return Decision("disagg", "weight", bucket)
        return Decision("colocated", "no_disagg", bucket)
    return Decision("colocated", "weight", bucket)


def parse_policy(source: Path, text: str) -> PolicySpec:
    """Validate policy YAML text into a PolicySpec; ValidationError naming file + key path otherwise."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ValidationError(f"{source}: must be a YAML mapping with keys version, keys_file, models, ...")
    try:
        spec = PolicySpec.model_validate(data)
    except PydanticValidationError as exc:
        raise ValidationError("\n".join(schema_problems(exc, PolicySpec, source))) from None
    problems = []
    if spec.stage not in spec.stages:
        known = ", ".join(spec.stages)
        problems.append(f"{source}: stage: {spec.stage!r} is not a stage; stages are: {known}")
    if spec.listen.admin_port is not None and spec.listen.admin_port == spec.listen.port != 0:
        problems.append(f"{source}: listen.admin_port: must differ from listen.port ({spec.listen.port})")
    for alias in spec.models:
        if not alias.strip() or alias != alias.strip():
            problems.append(f"{source}: models.{alias!r}: an alias must be non-empty, without outer spaces")
    if problems:
        raise ValidationError("\n".join(problems))
    return spec


def policy_text(data: Mapping[str, Any], source: Path, header: str = "") -> str:
    """A policy file's text: `header` as comment lines, then `data` as YAML; checked by parse_policy first,
    so nothing writes a policy the gateway would refuse."""
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    text = comments + yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True)
    parse_policy(source, text)
    return text


def with_stage(source: Path, text: str, version: int, stage: str, stages: Mapping[str, StageSpec]) -> str:
    """The policy file's text with version, stage and stages replaced and every other key kept."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ValidationError(f"{source}: is not a YAML mapping")
    data.update(version=version, stage=stage, stages={k: v.model_dump() for k, v in stages.items()})
    header = (
        "Managed by pdfleet: rendered by `invoke provision`; version, stage and stages set by the rollout "
        "controller (POST /admin/stage)."
    )
    return policy_text(data, source, header)


def write_policy(path: Path, text: str) -> None:
    """Replace the file in one rename (0600), so a reader sees the old or the new policy, never half."""
    parse_policy(path, text)
    fd, tmp = tempfile.mkstemp(prefix=".policy-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_policy_bytes(source: Path) -> bytes:
    """A policy file's bytes, or ValidationError naming the file."""
    try:
        return source.read_bytes()
    except OSError as exc:
        raise ValidationError(f"{source}: cannot read the policy file: {exc.strerror}") from None


def load_policy(path: str | Path) -> ActivePolicy:
    """Read, validate and compile a policy file plus the keys file it names (blocking I/O)."""
    source = Path(path)
    raw = read_policy_bytes(source)
    spec = parse_policy(source, raw.decode("utf-8", "replace"))
    keys_path = Path(spec.keys_file)
    if not keys_path.is_absolute():
        keys_path = source.parent / keys_path
    keys = load_keys(keys_path)
    problems = check_limit_names(spec.limits, {k.name for k in keys.values()}, set(spec.models), str(source))
    if problems:
        raise ValidationError("\n".join(problems))
    tok = spec.estimator.tokenizer
    if tok is not None:
        tok_path = Path(tok) if Path(tok).is_absolute() else source.parent / tok
        if not tok_path.is_file():
            raise ValidationError(f"{source}: estimator.tokenizer: {tok_path} is not a file (tokenizer.json)")
        try:
            counter = make_counter(tok_path, spec.estimator.chars_per_token)
        except Exception as exc:  # the tokenizers library raises its own exception types
            raise ValidationError(f"{source}: estimator.tokenizer: cannot load {tok_path}: {exc}") from None
    else:
        counter = make_counter(None, spec.estimator.chars_per_token)
    routes = {
        alias: Route(
            alias,
            tuple(r.colocated),
            r.disagg,
            r.upstream_model,
            itertools.count(),
            frozenset(r.disagg_endpoints),
        )
        for alias, r in spec.models.items()
    }
    return ActivePolicy(
        spec=spec,
        source=source,
        sha256=hashlib.sha256(raw).hexdigest(),
        keys=keys,
        routes=routes,
        counter=counter,
        loaded_at=time.time(),
        counts=PolicyCounts(),
    )


def restart_only_changes(old: PolicySpec, new: PolicySpec) -> list[str]:
    """Settings a reload cannot apply (the listening sockets); non-empty means reject the reload."""
    out = []
    for key in ("host", "port", "admin_port"):
        a, b = getattr(old.listen, key), getattr(new.listen, key)
        if a != b:
            out.append(f"listen.{key} changed from {a} to {b}; that needs a restart, not a reload")
    return out
