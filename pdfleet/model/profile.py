"""The profile schema: typed, strict pydantic models of a topology profile (see profile_loader for files).

Unknown keys are errors, values are typed strictly, models are immutable. `Profile.origin_of` says
which file (the profile or an `extends:` base) set a key, so later errors point at the file to edit.
"""

from __future__ import annotations

import difflib
import posixpath
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    model_validator,
)

from pdfleet.errors import ValidationError
from pdfleet.model import catalog
from pdfleet.model.connectors import MOONCAKE, NIXL, NIXL_SIDE_CHANNEL_PORT
from pdfleet.model.limits import KeyLimits
from pdfleet.model.monitoring import MonitoringSpec
from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.stages import StageSpec
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

POOL_NAMES = ("prefill", "decode", "colocated")
DEFAULT_KV_ROLES: dict[str, str | None] = {
    "prefill": "kv_producer",
    "decode": "kv_consumer",
    "colocated": None,
}
# Names the simulator's catalog knows, so a profile can only ask for a GPU or link it models.
SIM_GPUS = tuple(catalog.GPUS)
SIM_LINKS = tuple(catalog.LINKS)
MAX_GPU_MEMORY_UTILIZATION = 0.98

Port = Annotated[int, Field(ge=1, le=65535)]
Positive = Annotated[int, Field(gt=0)]


def _host_path(value: str) -> str:
    """A path on the hosts must be absolute and normalised: `invoke render` writes it under --out, and
    provision installs it, so `..`, `.`, `//` or a relative path could land anywhere."""
    if not value.startswith("/") or value == "/" or "//" in value or posixpath.normpath(value) != value:
        raise ValueError(
            f"must be an absolute, normalised path like /etc/pdfleet/gateway/keys.yaml "
            f"(no '..', '.', '//' or trailing '/') (got {value!r})"
        )
    return value


HostPath = Annotated[str, AfterValidator(_host_path)]


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


class _Model(BaseModel):
    """Strict, immutable, no unknown keys: a typo in a profile is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelSpec(_Model):
    """The model served: Hugging Face id, optional local path and tokenizer."""

    id: str = Field(min_length=1)
    path: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    max_model_len: Positive | None = None


class SimSpec(_Model):
    """Simulator settings used when `vllm.engine` is `sim` (the GPU and KV link it models)."""

    # Literals built from the catalog's names at import, so the schema and its errors list them; mypy
    # only takes Literals written out, and a copy of the names here would drift from the catalog
    gpu: Literal[SIM_GPUS] = "H100-SXM"  # type: ignore[valid-type]  # see above
    link: Literal[SIM_LINKS]  # type: ignore[valid-type]  # see above
    time_scale: float = Field(default=1.0, gt=0)


class VllmSpec(_Model):
    """The pinned vLLM release and which engine serves (`vllm`, or the GPU-less simulator `sim`)."""

    version: str
    engine: Literal["vllm", "sim"] = "vllm"
    venv: HostPath = "/opt/pdfleet/venv"
    sim: SimSpec


class KVTransferSpec(_Model):
    """KV transfer between prefill and decode: the vLLM connector and its transport settings."""

    connector: str = NIXL
    buffer_device: Literal["cuda", "cpu"] = "cuda"
    side_channel_host: str = "auto"  # auto: each host's inventory address (ansible_host)
    side_channel_port: Port = NIXL_SIDE_CHANNEL_PORT
    mooncake_bootstrap_port: Port = 8998
    mooncake_protocol: Literal["rdma", "tcp"] = "rdma"
    ucx_tls: str | None = None
    load_failure_policy: Literal["recompute", "fail"] | None = None
    extra_config: dict[str, Any] = Field(default_factory=dict)

    def side_channel_port_for(self, pool: str) -> int | None:
        """NIXL side-channel port of a pool's instance: prefill uses the base port, decode base+1.

        A same-host host runs both instances, and vLLM needs a distinct VLLM_NIXL_SIDE_CHANNEL_PORT per
        instance on a host; using base+1 for decode everywhere keeps one rule for every topology.
        None for the colocated pool (no connector) and for connectors other than NixlConnector.
        """
        if self.connector != NIXL:
            return None
        return {"prefill": self.side_channel_port, "decode": self.side_channel_port + 1}.get(pool)

    def bootstrap_port_for(self, pool: str) -> int | None:
        """MooncakeConnector's bootstrap port (VLLM_MOONCAKE_BOOTSTRAP_PORT): prefill instances only."""
        if self.connector == MOONCAKE and pool == "prefill":
            return self.mooncake_bootstrap_port
        return None


class PoolSpec(_Model):
    """One pool's vLLM instance per host: port, GPU indices on that host, and engine limits."""

    port: Port
    gpus: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    tensor_parallel_size: Positive = 1
    max_num_batched_tokens: Positive
    gpu_memory_utilization: float = Field(gt=0, le=MAX_GPU_MEMORY_UTILIZATION)
    enable_chunked_prefill: bool = True
    max_num_seqs: Positive = 256
    kv_cache_dtype: str = "auto"
    max_model_len: Positive | None = None
    kv_role: Literal["kv_producer", "kv_consumer", "kv_both"] | None = None
    extra_args: list[str] = Field(default_factory=list)


class Pools(_Model):
    """The pools a topology runs; prefill/decode get their kv_role default here."""

    prefill: PoolSpec | None = None
    decode: PoolSpec | None = None
    colocated: PoolSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_kv_roles(cls, data: Any) -> Any:
        """Fill kv_role from the pool name when absent, so the rendered role is always explicit."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for pool, role in DEFAULT_KV_ROLES.items():
            spec = data.get(pool)
            if isinstance(spec, dict) and "kv_role" not in spec and role is not None:
                data[pool] = {**spec, "kv_role": role}
        return data

    def get(self, pool: str) -> PoolSpec:
        """The spec of a pool that is set (KeyError for an unknown or unset pool)."""
        spec = getattr(self, pool, None) if pool in POOL_NAMES else None
        if spec is None:
            raise KeyError(f"pool {pool!r} is not set in this profile")
        return spec

    def items(self) -> list[tuple[str, PoolSpec]]:
        """(pool name, spec) for each pool that is set, in prefill, decode, colocated order."""
        return [(name, spec) for name in POOL_NAMES if (spec := getattr(self, name)) is not None]


class GpuSpec(_Model):
    """NVIDIA driver pin and GPU host settings."""

    driver_branch: str = Field(pattern=r"^\d{3}$")
    driver_version: str | None = Field(default=None, pattern=r"^\d{3}\.\d+(\.\d+)?$")
    open_modules: bool = True
    fabric_manager: Annotated[Literal["auto"] | bool, _auto_or(bool)] = "auto"
    gpudirect: Literal["auto", "dmabuf", "peermem", "none"] = "auto"
    persistence: bool = True


class RdmaSpec(_Model):
    """RoCE v2 settings for KV transfer NICs."""

    enabled: bool
    mtu: int = Field(default=4200, ge=1280, le=9216)
    roce_v2: bool = True
    gid_index: Annotated[Literal["auto"] | int, _auto_or(int)] = "auto"
    pfc_priority: int = Field(default=3, ge=0, le=7)
    dscp: int = Field(default=26, ge=0, le=63)
    ecn: bool = True
    min_bandwidth_gbps: float | None = Field(default=None, gt=0)


class Mirrors(_Model):
    """Package sources: public by default, local mirrors for air-gapped sites and the lab."""

    apt: str | None = None
    apt_trusted: bool = False
    pypi: str | None = None
    pypi_trusted_host: str | None = None
    cuda_repo: str = "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"


# vllm-router 0.1.17's choices for --policy, --prefill-policy and --decode-policy (its launcher's list;
# each starts and routes in P/D mode). `rendezvous_hash`, named in the router's docs, is not among them.
ROUTER_POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)
# round_robin: a counter, no work per prompt; cache_aware (the router's default) walks a prefix tree over
# every prompt's text, which costs long prompts TTFT (bench/router_policy.py measures each policy).
DEFAULT_ROUTER_POLICY = "round_robin"


def _router_policy_name(value: Any) -> Any:
    """A policy name vllm-router accepts in P/D mode, else an error naming the choices (and a near miss)."""
    if isinstance(value, str) and value in ROUTER_POLICIES:
        return value
    near = difflib.get_close_matches(str(value).lower().replace("-", "_"), ROUTER_POLICIES, n=1)
    hint = f"; did you mean {near[0]}?" if near else ""
    raise ValueError(
        f"not a policy vllm-router 0.1.17 accepts in P/D mode{hint} (got {value!r}); "
        f"one of: {', '.join(ROUTER_POLICIES)}"
    )


class RouterPolicy(_Model):
    """vllm-router's worker selection in P/D mode, per pool (its --prefill-policy and --decode-policy)."""

    prefill: Annotated[str, BeforeValidator(_router_policy_name)] = DEFAULT_ROUTER_POLICY
    decode: Annotated[str, BeforeValidator(_router_policy_name)] = DEFAULT_ROUTER_POLICY


def _one_or_per_pool(value: Any) -> Any:
    """`router_policy: NAME` sets both pools; `{prefill: NAME, decode: NAME}` each (unset: the default)."""
    if isinstance(value, str):
        name = _router_policy_name(value)
        return {"prefill": name, "decode": name}
    if isinstance(value, dict | RouterPolicy):
        return value
    raise ValueError(f"must be a policy name (both pools) or {{prefill: NAME, decode: NAME}} (got {value!r})")


class GatewayLimits(_Model):
    """Per-key limits the gateway's policy gets (`limits:`): a default for every key, overrides for the
    two keys provision makes (`client`, `admin`), and a prompt-token cap on the model alias."""

    default: KeyLimits = Field(default_factory=KeyLimits)
    keys: dict[Literal["client", "admin"], KeyLimits] = Field(default_factory=dict)
    model_max_prompt_tokens: Positive | None = None


class GatewaySpec(_Model):
    """The OpenAI-compatible gateway: ports, keys, long-prompt threshold and rollout stages."""

    port: Port = 8080
    router_port: Port = 8090
    admin_port: Port | None = None
    keys_file: HostPath = "/etc/pdfleet/gateway/keys.yaml"
    long_prompt_tokens: Positive = 8192
    chars_per_token: float = Field(default=DEFAULT_CHARS_PER_TOKEN, gt=0)
    stage: str
    stages: dict[str, StageSpec] = Field(min_length=1)
    model_alias: str | None = None
    policy_version: Positive = 1  # bump to mark a policy change; the gateway reports it as a metric
    router_version: str = "0.1.17"  # PyPI vllm-router, the P/D router the gateway fronts
    router_prometheus_port: Port = 29000
    router_policy: Annotated[RouterPolicy, BeforeValidator(_one_or_per_pool)] = Field(
        default_factory=RouterPolicy
    )
    # On the control machine: the plaintext client and admin keys (0600, generated when missing).
    # Only their SHA-256 hashes reach the gateway host.
    client_key_file: str = "~/.config/pdfleet/gateway-client.key"
    admin_key_file: str = "~/.config/pdfleet/gateway-admin.key"
    limits: GatewayLimits = Field(default_factory=GatewayLimits)  # all off unless set


class SloSpec(_Model):
    """P99 targets the rollout gates on; bench's per-request goodput bounds, verdict bounds and stall gap."""

    ttft_p99_ms: float = Field(gt=0)
    tpot_p99_ms: float = Field(gt=0)
    itl_p99_ms: float = Field(gt=0)
    kv_transfer_p99_ms: float = Field(gt=0)
    # `invoke bench`: the verdict compares each pool's TTFT/TPOT P95 with these (unset: the P99 target)
    ttft_p95_ms: float | None = Field(default=None, gt=0)
    tpot_p95_ms: float | None = Field(default=None, gt=0)
    # ... and splitting pays only when both queues' P95 (vllm:request_queue_time_seconds) exceed these;
    # that histogram's first bucket ends at 0.3 s, so a bound below 300 ms cannot be judged from it
    prefill_queue_p95_ms: float = Field(default=500.0, gt=0)
    decode_queue_p95_ms: float = Field(default=500.0, gt=0)
    stall_ms: float = Field(default=500.0, gt=0)  # an inter-token gap this long: "the typewriter stopped"
    attainment_pct: float = Field(default=90.0, gt=0, le=100)  # --sweep: share of good requests (DistServe)

    @property
    def ttft_bound_ms(self) -> float:
        """The TTFT P95 bound of bench's verdict."""
        return self.ttft_p95_ms if self.ttft_p95_ms is not None else self.ttft_p99_ms

    @property
    def tpot_bound_ms(self) -> float:
        """The TPOT P95 bound of bench's verdict."""
        return self.tpot_p95_ms if self.tpot_p95_ms is not None else self.tpot_p99_ms


class Profile(_Model):
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
    # key path -> file that set it (this file or a base), so later errors point at the file to edit
    _origins: dict[tuple[str, ...], Path] = PrivateAttr(default_factory=dict)

    def origin_of(self, dotted: str) -> Path:
        """The profile file (itself or an `extends:` base) that set a key path, e.g. `pools.decode.gpus`."""
        return origin_of(dotted, self.source, self._origins)

    @property
    def disaggregated(self) -> bool:
        """True for same-host and cross-host (prefill/decode pools joined by a KV connector)."""
        return self.topology != "colocated"

    def side_channel_port_for(self, pool: str) -> int | None:
        """See KVTransferSpec.side_channel_port_for; None for every pool of a colocated profile.

        vLLM 0.11 binds one port per TP rank (base .. base+tp-1), so the decode instance starts past
        the prefill instance's last port: a same-host pair with TP >= 2 would collide on base+1.
        """
        if not self.disaggregated:
            return None
        port = self.kv_transfer.side_channel_port_for(pool)
        rel = find_release(self.vllm.version, RELEASES)
        prefill = self.pools.prefill
        if pool == "decode" and port is not None and rel is not None and prefill is not None:
            base = self.kv_transfer.side_channel_port
            return base + len(rel.side_channel_ports(base, prefill.tensor_parallel_size))
        return port


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
