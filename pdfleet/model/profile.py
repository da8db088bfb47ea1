"""The profile schema: typed, strict pydantic models of a topology profile (see profile_loader for files).

Unknown keys are errors, values are typed strictly, models are immutable. `Profile.origin_of` says
which file (the profile or an `extends:` base) set a key, so later errors point at the file to edit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr, model_validator

from pdfleet.errors import ValidationError
from pdfleet.model import catalog
from pdfleet.model.limits import KeyLimits
from pdfleet.model.monitoring import MonitoringSpec
from pdfleet.model.outside import ALIAS_PATTERN, OutsideAlias
from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.routing import MODEL_DECIDER_KEYS, DeciderSpec
from pdfleet.model.served import (
    DEFAULT_ROUTER_METRICS_PORT,
    DEFAULT_ROUTER_PORT,
    MODEL_KEYS,
    ModelGateway,
    ServedModel,
    expand_models,
    slug,
)
from pdfleet.model.shadowing import CaptureSpec, ShadowSpec
from pdfleet.model.specs import (
    DEFAULT_KV_ROLES,
    DEFAULT_ROUTER_POLICY,
    MAX_GPU_MEMORY_UTILIZATION,
    POOL_NAMES,
    ROUTER_POLICIES,
    HostPath,
    KVTransferSpec,
    ModelSpec,
    Pools,
    PoolSpec,
    Port,
    Positive,
    RouterPolicy,
    SloSpec,
    StrictModel,
    one_or_per_pool,
)
from pdfleet.model.stages import StageSpec
from pdfleet.model.tls import GatewayTlsSetting
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

# The per-model building blocks live in pdfleet.model.specs; these names stay importable from here.
__all__ = [
    "DEFAULT_KV_ROLES",
    "DEFAULT_ROUTER_POLICY",
    "MAX_GPU_MEMORY_UTILIZATION",
    "POOL_NAMES",
    "ROUTER_POLICIES",
    "KVTransferSpec",
    "ModelSpec",
    "PoolSpec",
    "Pools",
    "Profile",
    "ProfileError",
    "RouterPolicy",
    "ServedModel",
    "SloSpec",
]

# Names the simulator's catalog knows, so a profile can only ask for a GPU or link it models.
SIM_GPUS = tuple(catalog.GPUS)
SIM_LINKS = tuple(catalog.LINKS)


def _auto_or(kind: type) -> BeforeValidator:
    """One clear error for `Literal["auto"] | bool|int` fields (pydantic would report one per union arm)."""

    def check(value: Any) -> Any:
        if isinstance(value, str) and value == "auto":
            return value
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        tail = "true or false" if kind is bool else "a non-negative integer"
        raise ValueError(f"must be 'auto' or {tail} (got {value!r})")

    return BeforeValidator(check)


class SimSpec(StrictModel):
    """Simulator settings used when `vllm.engine` is `sim` (the GPU and KV link it models)."""

    # Literals built from the catalog's names at import, so the schema and its errors list them; mypy
    # only takes Literals written out, and a copy of the names here would drift from the catalog
    gpu: Literal[SIM_GPUS] = "H100-SXM"  # type: ignore[valid-type]  # see above
    link: Literal[SIM_LINKS]  # type: ignore[valid-type]  # see above
    time_scale: float = Field(default=1.0, gt=0)


class VllmSpec(StrictModel):
    """The pinned vLLM release and which engine serves (`vllm`, or the GPU-less simulator `sim`)."""

    version: str
    engine: Literal["vllm", "sim"] = "vllm"
    venv: HostPath = "/opt/pdfleet/venv"
    sim: SimSpec


class GpuSpec(StrictModel):
    """NVIDIA driver pin and GPU host settings."""

    driver_branch: str = Field(pattern=r"^\d{3}$")
    driver_version: str | None = Field(default=None, pattern=r"^\d{3}\.\d+(\.\d+)?$")
    open_modules: bool = True
    fabric_manager: Annotated[Literal["auto"] | bool, _auto_or(bool)] = "auto"
    gpudirect: Literal["auto", "dmabuf", "peermem", "none"] = "auto"
    persistence: bool = True


class RdmaSpec(StrictModel):
    """RoCE v2 settings for KV transfer NICs."""

    enabled: bool
    mtu: int = Field(default=4200, ge=1280, le=9216)
    roce_v2: bool = True
    gid_index: Annotated[Literal["auto"] | int, _auto_or(int)] = "auto"
    pfc_priority: int = Field(default=3, ge=0, le=7)
    dscp: int = Field(default=26, ge=0, le=63)
    ecn: bool = True
    min_bandwidth_gbps: float | None = Field(default=None, gt=0)


class Mirrors(StrictModel):
    """Package sources: public by default, local mirrors for air-gapped sites and the lab."""

    apt: str | None = None
    apt_trusted: bool = False
    pypi: str | None = None
    pypi_trusted_host: str | None = None
    # NVIDIA's CUDA repository for each host's distribution by default (pdfleet.hw.distro); one URL for every
    # distribution, or one per distribution ({ubuntu2404: URL, ...}; keys in pdfleet.model.platforms).
    cuda_repo: str | dict[str, str] | None = None


class GatewayLimits(StrictModel):
    """Per-key limits the gateway's policy gets (`limits:`): a default for every key, overrides for the
    two keys provision makes (`client`, `admin`), and a prompt-token cap on the model alias."""

    default: KeyLimits = Field(default_factory=KeyLimits)
    keys: dict[Literal["client", "admin"], KeyLimits] = Field(default_factory=dict)
    model_max_prompt_tokens: Positive | None = None


class GatewaySpec(StrictModel):
    """The OpenAI-compatible gateway: ports, keys, long-prompt threshold and rollout stages."""

    port: Port = 8080
    router_port: Port = DEFAULT_ROUTER_PORT
    admin_port: Port | None = None
    keys_file: HostPath = "/etc/pdfleet/gateway/keys.yaml"
    long_prompt_tokens: Positive = 8192
    chars_per_token: float = Field(default=DEFAULT_CHARS_PER_TOKEN, gt=0)
    stage: str
    stages: dict[str, StageSpec] = Field(min_length=1)
    model_alias: str | None = None
    policy_version: Positive = 1  # bump to mark a policy change; the gateway reports it as a metric
    router_version: str = "0.1.17"  # PyPI vllm-router, the P/D router the gateway fronts
    router_prometheus_port: Port = DEFAULT_ROUTER_METRICS_PORT
    router_policy: Annotated[RouterPolicy, BeforeValidator(one_or_per_pool)] = Field(
        default_factory=RouterPolicy
    )
    # On the control machine: the plaintext client and admin keys (0600, generated when missing).
    # Only their SHA-256 hashes reach the gateway host.
    client_key_file: str = "~/.config/pdfleet/gateway-client.key"
    admin_key_file: str = "~/.config/pdfleet/gateway-admin.key"
    # the rollout controller's stage-only key (it may read the policy and set the stage, nothing else): its
    # plaintext goes to the controller's host, its hash to the gateways; the admin key stays here
    controller_key_file: str = "~/.config/pdfleet/gateway-controller.key"
    # named client keys (`invoke keys.*`): their registry (names, hashes, dates, limits) and one 0600 file
    # per key to hand to its client
    keys_dir: str = "~/.config/pdfleet/gateway-keys"
    limits: GatewayLimits = Field(default_factory=GatewayLimits)  # all off unless set
    # how the gateway decides per request (pdfleet.model.routing): defaults route as before the decider
    decider: DeciderSpec = Field(default_factory=DeciderSpec)
    # shadow traffic's bounds and traffic capture (pdfleet.model.shadowing): rendered into the policy when set
    shadow: ShadowSpec = Field(default_factory=ShadowSpec)
    capture: CaptureSpec = Field(default_factory=CaptureSpec)
    # aliases served by a hosted OpenAI/Anthropic-compatible API (pdfleet.model.outside), beside the models
    outside: dict[Annotated[str, Field(pattern=ALIAS_PATTERN)], OutsideAlias] = Field(default_factory=dict)
    # the site's PKI (pdfleet.model.tls), or `off` for plain HTTP: no default, a profile says which
    tls: GatewayTlsSetting


class RequestPathSpec(StrictModel):
    """`invoke plan`'s request path per route: the milliseconds a first token spends outside the engines
    (client, TLS, gateway, for P/D the router), as measured somewhere (`source` says where and when), in
    wall ms (a simulator's `time_scale` divides them as the bench divides its client times)."""

    colocated_ms: float = Field(ge=0)
    disagg_ms: float = Field(ge=0)
    source: str = Field(min_length=1)


class PlanSpec(StrictModel):
    """`invoke plan`'s inputs a fleet cannot give (docs/plan.md): the request path for a plan without one."""

    request_path: RequestPathSpec | None = None


class Profile(StrictModel):
    """A validated topology profile (see the module docstring for files, extends and errors)."""

    name: str
    source: Path
    extends: str | None = None
    description: str | None = None
    topology: Literal["same-host", "cross-host", "colocated"]
    model: ModelSpec
    vllm: VllmSpec
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec)
    pools: Pools = Field(default_factory=Pools)
    gpu: GpuSpec
    rdma: RdmaSpec
    mirrors: Mirrors = Field(default_factory=Mirrors)
    gateway: GatewaySpec
    slo: SloSpec
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    plan: PlanSpec = Field(default_factory=PlanSpec)  # invoke plan's request path without a fleet
    # several models (issue 24): each entry overrides per-model keys and inherits the rest from above
    models: list[ServedModel] | None = Field(default=None, min_length=1)
    # key path -> file that set it (this file or a base), so later errors point at the file to edit
    _origins: dict[tuple[str, ...], Path] = PrivateAttr(default_factory=dict)
    _only: ServedModel | None = PrivateAttr(default=None)  # a for_model() view's one model

    def origin_of(self, dotted: str) -> Path:
        """The profile file (itself or an `extends:` base) that set a key path, e.g. `pools.decode.gpus`."""
        return origin_of(dotted, self.source, self._origins)

    @model_validator(mode="before")
    @classmethod
    def _expand_models(cls, data: Any) -> Any:
        """Each `models:` entry merged over the per-model keys it inherits (pdfleet.model.served)."""
        return expand_models(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _number_models(self) -> Profile:
        """Each listed model learns its place, so its errors name `models[i].key.path`."""
        for index, spec in enumerate(self.models or ()):
            spec._index = index
        return self

    @property
    def served(self) -> tuple[ServedModel, ...]:
        """The models this profile serves, in order: its `models:` list, or its top level as one model
        (worked out on each call, so a model_copy with new top-level keys serves what it says)."""
        if self._only is not None:
            return (self._only,)
        return tuple(self.models) if self.models else (self._single(),)

    def _single(self) -> ServedModel:
        """The top level as one model: named after its alias (else its id), answering to that alias."""
        gw = self.gateway
        alias = gw.model_alias or self.model.id
        gateway = ModelGateway.model_validate(
            {key: getattr(gw, key) for key in ModelGateway.model_fields if key not in ("limits", "decider")}
            | {"limits": {"model_max_prompt_tokens": gw.limits.model_max_prompt_tokens}}
            | {"decider": {key: getattr(gw.decider, key) for key in MODEL_DECIDER_KEYS}}
        )
        return ServedModel(
            name=slug(alias),
            model=self.model,
            aliases=[alias],
            topology=self.topology,
            pools=self.pools,
            kv_transfer=self.kv_transfer,
            slo=self.slo,
            rollout=self.rollout,
            gateway=gateway,
        )

    def served_model(self, name: str | None = None) -> ServedModel:
        """A served model by name; without one, the only model (ValidationError naming the choices)."""
        served = self.served
        if name is None and len(served) == 1:
            return served[0]
        found = next((spec for spec in served if spec.name == name), None)
        if found is None:
            names = ", ".join(spec.name for spec in served)
            what = "several models; name one" if name is None else f"no model {name!r}"
            raise ValidationError(f"{self.source}: {what} (--model): {names}")
        return found

    def for_model(self, spec: ServedModel) -> Profile:
        """This profile as if it served `spec` alone (its per-model keys at the top level), for readers
        written against one model (release checks, bench, doctor); `served` is that model."""
        gw = self.gateway
        # attributes, not model_dump(): model_copy does not validate, so stages must stay StageSpecs
        own = ("limits", "decider")
        model_gw = {key: getattr(spec.gateway, key) for key in ModelGateway.model_fields if key not in own}
        cap = spec.gateway.limits.model_max_prompt_tokens
        limits = gw.limits.model_copy(update={"model_max_prompt_tokens": cap})
        decider = gw.decider.model_copy(
            update={key: getattr(spec.gateway.decider, key) for key in MODEL_DECIDER_KEYS}
        )
        gateway = gw.model_copy(
            update={**model_gw, "model_alias": spec.aliases[0], "limits": limits, "decider": decider}
        )
        update = {key: getattr(spec, key) for key in MODEL_KEYS}
        view = self.model_copy(update={**update, "gateway": gateway, "models": None})
        view._only = spec
        return view

    @property
    def disaggregated(self) -> bool:
        """True when any model it serves runs prefill/decode pools joined by a KV connector."""
        return any(spec.disaggregated for spec in self.served)

    def side_channel_port_for(self, pool: str) -> int | None:
        """The first model's NIXL side-channel port of a pool (ServedModel.side_channel_port_for)."""
        return self.served[0].side_channel_port_for(pool, self.vllm.version)


class ProfileError(ValidationError):
    """A profile that does not validate; `problems` holds one `file: key.path: message` line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


Origins = dict[tuple[str, ...], Path]


def origin_of(dotted: str, default: Path, origins: Origins) -> Path:
    """The file that set the longest prefix of a key path (`default` if none did)."""
    # "kv_transfer.side_channel_port+1" is reported against kv_transfer.side_channel_port
    parts = tuple(p.split("+")[0] for p in dotted.replace("[", ".").replace("]", "").split(".") if p)
    for end in range(len(parts), 0, -1):
        if parts[:end] in origins:
            return origins[parts[:end]]
    return default
