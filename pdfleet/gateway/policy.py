"""The policy file: schema, validation, reading and writing it, and the pure routing decision built from it.

A policy file is YAML validated by pydantic (unknown keys are errors; every error names the file and
the key path). Loading yields an immutable `ActivePolicy`; a reload builds a new one and swaps the
reference, so a request keeps the policy it started with until it ends. This module is the one reader
and writer of policy files: the gateway role renders through `policy_text`, `POST /admin/stage` rewrites
through `with_stage` and `write_policy`, the bench's loopback gateways write through `write_policy`, and
every reader (the gateway, provision's live-stage rule) parses through `parse_policy`.

Several models, each rolled out on its own: `groups:` names model groups (the pdfleet model name) and each
alias under `models:` may name its `group:`. A group may set its own `stage`, `stages` and
`long_prompt_tokens`; whatever it leaves out follows the top-level keys, so a policy without `groups:` (every
policy written before them) routes exactly as it did. Several aliases may share a group; they then share its
stage. An alias without a group follows the top-level stage and is its own model in the metrics (label `model`
= its group, else the alias; `-` before an alias is known).

    groups:
      chat-8b: {stage: long-prompts}              # its own stage, the top-level stages
    models:
      chat: {colocated: [http://10.0.0.11:8000], disagg: http://127.0.0.1:8100, group: chat-8b}
      chat-latest: {colocated: [http://10.0.0.11:8000], group: chat-8b}
      gpt-4o:                                     # an outside endpoint (outside.py): no pools, no stage
        outside: {api: openai, base_url: https://api.openai.com, key_file: openai.key}
        upstream_model: gpt-4o
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.gateway import tls
from pdfleet.gateway.keys import KeyEntry, entry_limits, load_keys
from pdfleet.gateway.limits import check_limit_aliases, check_limit_keys
from pdfleet.gateway.outside import Outside, load_outside
from pdfleet.gateway.policy_spec import (
    ROUTER_PD_ENDPOINTS,
    GroupSpec,
    ModelRoute,
    PolicySpec,
    group_problems,
    route_problems,
)
from pdfleet.gateway.prompt_ids import load_route_tokenizer
from pdfleet.model.limits import LimitsSpec
from pdfleet.model.schema_errors import schema_problems
from pdfleet.model.stages import LENGTH_CLASSES, StageSpec
from pdfleet.model.yamlfile import parse_yaml
from pdfleet.tokens import HFTokenizer, TextCounter, make_counter

POOLS: tuple[str, ...] = ("colocated", "disagg")
BUCKETS = 100
ENDPOINTS: tuple[str, ...] = ("chat", "completions", "messages")
Pool = Literal["colocated", "disagg"]
Target = Literal["colocated", "disagg", "outside"]  # where a request goes: a pool or an outside endpoint
TARGETS: tuple[str, ...] = ("colocated", "disagg", "outside")
NO_MODEL = "-"  # the metrics' model label before an alias is known
LengthClass = Literal["short", "long"]


@dataclass(frozen=True)
class Staging:
    """What routes a model group's requests: its stage's name and weights, its long-prompt threshold."""

    stage: str
    weights: StageSpec
    stages: Mapping[str, StageSpec]
    long_prompt_tokens: int


@dataclass(frozen=True)
class Route:
    """A compiled model alias: pools as URL tuples plus a round-robin over the colocated ones, its group's
    staging, its metrics label and the P/D instances the decider scrapes; or an outside endpoint."""

    alias: str
    colocated: tuple[str, ...]
    disagg: str | None
    upstream_model: str | None
    _rr: Iterator[int] = field(compare=False, repr=False)
    disagg_endpoints: frozenset[str] = frozenset(ROUTER_PD_ENDPOINTS)
    staging: Staging | None = None  # None only for an outside alias
    model: str = NO_MODEL  # the metrics label: the group, else the alias
    group: str | None = None
    outside: Outside | None = None
    prefill: tuple[str, ...] = ()  # the P/D pool's instances the decider scrapes
    decode: tuple[str, ...] = ()
    kv_events: tuple[str, ...] = ()  # each colocated instance's KV-events publisher (empty: the index)
    kv_events_release: str | None = None  # the vLLM release whose event format they publish
    prefill_kv_events: tuple[str, ...] = ()  # each prefill instance's publisher (the P/D candidate's facts)
    prefill_cache_aware: bool = False  # vllm-router picks the prefill instance by prefix (else spreads)
    tokenizer: HFTokenizer | None = field(default=None, compare=False)  # the engine's ids of chat prompts
    kv_events_replay: tuple[str, ...] = ()  # each colocated instance's replay socket (kv_events' order)
    prefill_kv_events_replay: tuple[str, ...] = ()  # each prefill instance's (prefill_kv_events' order)

    def next_rr(self) -> int:
        """The round robin's next position over the colocated instances."""
        return next(self._rr)

    def colocated_pair(self, instance: int) -> tuple[str, str | None]:
        """A colocated instance's URL and, when there is another one, the next one to retry on."""
        n = len(self.colocated)
        return self.colocated[instance % n], (self.colocated[(instance + 1) % n] if n > 1 else None)


# the reason the routing-decisions metric (rollout measure, dashboards) has named each decision since before
# the decider; pdfleet_gateway_decisions_total carries the decider's own closed set
LEGACY_REASONS = {
    "forced_header": "header",
    "stage_weight": "weight",
    "short": "weight",
    "cached_prefix": "weight",
    "no_pd_pool": "no_disagg",
    "endpoint_not_carried": "endpoint_not_on_disagg",
}


@dataclass(slots=True)
class Decision:
    """Which pool a request goes to and why (a pdfleet.gateway.decider reason, or `outside`), its sticky
    bucket, the colocated instance (its index in the route) and the tokens its class was taken from;
    with a prefix index, the candidate it was routed to (a colocated instance's URL, the P/D router's)
    and the prompt tokens the index estimated that candidate had cached (None: no index read)."""

    pool: Target
    reason: str
    bucket: int
    instance: int = 0
    effective: int = 0
    cached: int | None = None
    candidate: str = ""

    @property
    def legacy_reason(self) -> str:
        """The reason as pdfleet_gateway_routing_decisions names it."""
        return LEGACY_REASONS.get(self.reason, self.reason)


def zero_decisions() -> dict[str, dict[str, int]]:
    """Decisions per length class and target, all zero."""
    return {c: dict.fromkeys(TARGETS, 0) for c in LENGTH_CLASSES}


@dataclass
class PolicyCounts:
    """Counts since this policy became active (shown by /admin/policy), in all and per model label."""

    requests: int = 0
    in_flight: int = 0
    decisions: dict[str, dict[str, int]] = field(default_factory=zero_decisions)
    fallbacks: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    def count(self, model: str, cls: str, target: str) -> None:
        """One routed request of a model in a length class, sent to a target."""
        self.requests += 1
        self.decisions[cls][target] += 1
        own = self.by_model.get(model)
        if own is None:
            own = self.by_model[model] = zero_decisions()
        own[cls][target] += 1


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
    tls_expiry: datetime | None = None  # the certificate's notAfter (UTC) when listen.tls is set
    limits: LimitsSpec = LimitsSpec()  # the policy's limits and the ones keys carry in the keys file

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
            "decider": self.spec.decider.model_dump(),
            "groups": {name: self.group_summary(name) for name in self.spec.groups},
            "models": {a: _route_summary(r) for a, r in self.routes.items()},
            "keys": len(self.keys),
            "counts": {
                "requests": self.counts.requests,
                "in_flight": self.counts.in_flight,
                "decisions": self.counts.decisions,
                "fallbacks": self.counts.fallbacks,
                "by_model": self.counts.by_model,
            },
        }

    def group_summary(self, name: str) -> dict[str, Any]:
        """One group's stage, weights, stages, threshold, aliases and decisions (for /admin/policy)."""
        staging = group_staging(self.spec, name)
        return {
            "stage": staging.stage,
            "stage_percent_disagg": staging.weights.model_dump(),
            "stages": {k: v.model_dump() for k, v in staging.stages.items()},
            "long_prompt_tokens": staging.long_prompt_tokens,
            "aliases": sorted(a for a, r in self.routes.items() if r.group == name),
            "decisions": self.counts.by_model.get(name, zero_decisions()),
        }


def _route_summary(route: Route) -> dict[str, Any]:
    """An alias as /admin/policy shows it (an outside one: its API, URL and key file, never its key)."""
    out: dict[str, Any] = {"model": route.model, "group": route.group, "upstream_model": route.upstream_model}
    if route.outside is not None:
        return {**out, "outside": route.outside.summary()}
    return {
        **out,
        "colocated": list(route.colocated),
        "disagg": route.disagg,
        "disagg_endpoints": sorted(route.disagg_endpoints),
        "prefill": list(route.prefill),
        "decode": list(route.decode),
    }


def group_staging(spec: PolicySpec, group: str | None) -> Staging:
    """A group's staging (None: the top level), each key it leaves out taken from the top level."""
    own = spec.groups[group] if group is not None else GroupSpec()
    stages = own.stages if own.stages is not None else spec.stages
    stage = own.stage if own.stage is not None else spec.stage
    threshold = own.long_prompt_tokens if own.long_prompt_tokens is not None else spec.long_prompt_tokens
    return Staging(stage, stages[stage], stages, threshold)


def bucket_of(sticky_key: str) -> int:
    """Stable bucket 0..99 of a sticky key, so one conversation always lands in the same bucket."""
    digest = hashlib.sha256(sticky_key.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def length_class(prompt_tokens: int, long_prompt_tokens: int) -> LengthClass:
    """`long` when the prompt has at least the threshold's tokens."""
    return "long" if prompt_tokens >= long_prompt_tokens else "short"


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
    for alias, route in spec.models.items():
        if not alias.strip() or alias != alias.strip():
            problems.append(f"{source}: models.{alias!r}: an alias must be non-empty, without outer spaces")
        problems += [f"{source}: models.{alias}.{p}" for p in route_problems(spec, alias, route)]
    problems += [f"{source}: {p}" for p in group_problems(spec)]
    problems += check_limit_aliases(spec.limits, set(spec.models), str(source))
    if problems:
        raise ValidationError("\n".join(problems))
    return spec


def policy_text(data: Mapping[str, Any], source: Path, header: str = "") -> str:
    """`header` as comment lines, then `data` as YAML, checked by parse_policy (never a refused policy)."""
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    text = comments + yaml.safe_dump(dict(data), sort_keys=False, allow_unicode=True)
    parse_policy(source, text)
    return text


def with_stage(
    source: Path,
    text: str,
    version: int,
    stage: str,
    stages: Mapping[str, StageSpec],
    model: str | None = None,
) -> str:
    """The policy file's text with version, stage and stages replaced and every other key kept; with
    `model`, that group's stage and stages (the top level and every other group kept)."""
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ValidationError(f"{source}: is not a YAML mapping")
    dumped = {k: v.model_dump() for k, v in stages.items()}
    if model is None:
        data.update(version=version, stage=stage, stages=dumped)
    else:
        groups = data.get("groups")
        if not isinstance(groups, dict) or not isinstance(groups.get(model), dict):
            raise ValidationError(f"{source}: groups.{model}: no such model group in the policy")
        groups[model].update(stage=stage, stages=dumped)
        data["version"] = version
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
    keys_path = source.parent / spec.keys_file  # an absolute keys_file stays itself (pathlib's join)
    keys = load_keys(keys_path)
    limits = effective_limits(spec, keys, source, keys_path)
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
    routes = {alias: compile_route(spec, alias, r, source) for alias, r in spec.models.items()}
    tls_expiry = None if spec.listen.tls is None else tls.check(spec.listen.tls, source.parent, str(source))
    return ActivePolicy(
        spec=spec,
        source=source,
        sha256=hashlib.sha256(raw).hexdigest(),
        keys=keys,
        routes=routes,
        counter=counter,
        loaded_at=time.time(),
        counts=PolicyCounts(),
        tls_expiry=tls_expiry,
        limits=limits,
    )


def effective_limits(
    spec: PolicySpec, keys: Mapping[str, KeyEntry], source: Path, keys_path: Path
) -> LimitsSpec:
    """The policy's `limits:` with the limits client keys carry in the keys file added under their names
    (a name limited in both places is refused: one place says a key's limits)."""
    own = entry_limits(keys)
    problems = check_limit_keys(spec.limits, {k.name for k in keys.values()}, str(source))
    problems += [
        f"{keys_path}: the key {name!r} has limits here and in {source}'s limits.keys; keep one"
        for name in own
        if name in spec.limits.keys
    ]
    merged = spec.limits.model_copy(update={"keys": {**spec.limits.keys, **own}})
    problems += check_limit_aliases(LimitsSpec(keys=own), set(spec.models), str(keys_path))
    if problems:
        raise ValidationError("\n".join(problems))
    return merged


def compile_route(spec: PolicySpec, alias: str, r: ModelRoute, source: Path) -> Route:
    """An alias as requests use it: its pools and group's staging, or its outside endpoint (key read)."""
    if r.outside is not None:
        outside = load_outside(r.outside, source.parent, f"{source}: models.{alias}.outside.key_file")
        rr = itertools.count()
        return Route(alias, (), None, r.upstream_model, rr, frozenset(), None, alias, None, outside)
    return Route(
        alias,
        tuple(r.colocated),
        r.disagg,
        r.upstream_model,
        itertools.count(),
        frozenset(r.disagg_endpoints),
        group_staging(spec, r.group),
        r.group or alias,
        r.group,
        None,
        tuple(r.prefill),
        tuple(r.decode),
        tuple(r.kv_events),
        r.kv_events_release,
        tuple(r.prefill_kv_events),
        r.prefill_cache_aware,
        load_route_tokenizer(r.tokenizer, source, f"models.{alias}.tokenizer"),
        tuple(r.kv_events_replay),
        tuple(r.prefill_kv_events_replay),
    )


def restart_only_changes(old: PolicySpec, new: PolicySpec) -> list[str]:
    """Settings a reload cannot apply (the listening sockets); non-empty means reject the reload."""
    out = []
    for key in ("host", "port", "admin_port"):
        a, b = getattr(old.listen, key), getattr(new.listen, key)
        if a != b:
            out.append(f"listen.{key} changed from {a} to {b}; that needs a restart, not a reload")
    if (old.listen.tls is None) != (new.listen.tls is None):
        turned = "on" if new.listen.tls is not None else "off"
        out.append(f"listen.tls turned {turned}; that needs a restart (a reload only renews the certificate)")
    return out
