"""Topology profiles: YAML files under profiles/, merged through `extends:`, validated into pydantic models.

Every error names the file, the key path and what is allowed, e.g.
`profiles/cross-rdma.yml: pools.decode.gpu_memory_utilization: must be <= 0.98 (got 0.99)`.
A key set in a base profile is reported against the base file. Files whose name starts with `_`
(e.g. `profiles/_base.yml`) are bases for `extends:` only: they are not listed and cannot be loaded
as a profile. `extends:` merges mappings key by key (the extending file wins); lists and scalars are
replaced whole; `key: null` in the extending file clears a key set by the base.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PrivateAttr, model_validator
from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import ValidationError
from pdfleet.model import catalog
from pdfleet.model.connectors import MOONCAKE, NIXL, NIXL_SIDE_CHANNEL_PORT
from pdfleet.model.inventory import Inventory, read_yaml
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

PROFILE_SUFFIXES = (".yml", ".yaml")
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

    gpu: Literal[SIM_GPUS] = "H100-SXM"  # type: ignore[valid-type]
    link: Literal[SIM_LINKS]  # type: ignore[valid-type]
    time_scale: float = Field(default=1.0, gt=0)


class VllmSpec(_Model):
    """The pinned vLLM release and which engine serves (`vllm`, or the GPU-less simulator `sim`)."""

    version: str
    engine: Literal["vllm", "sim"] = "vllm"
    venv: str = "/opt/pdfleet/venv"
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


class StageSpec(_Model):
    """Percent of requests per length class sent to the disaggregated pool in a rollout stage."""

    short: int = Field(ge=0, le=100)
    long: int = Field(ge=0, le=100)


class GatewaySpec(_Model):
    """The OpenAI-compatible gateway: ports, keys, long-prompt threshold and rollout stages."""

    port: Port = 8080
    router_port: Port = 8090
    admin_port: Port | None = None
    keys_file: str = "/etc/pdfleet/gateway/keys.yaml"
    long_prompt_tokens: Positive = 8192
    chars_per_token: float = Field(default=DEFAULT_CHARS_PER_TOKEN, gt=0)
    stage: str
    stages: dict[str, StageSpec] = Field(min_length=1)
    model_alias: str | None = None
    policy_version: Positive = 1  # bump to mark a policy change; the gateway reports it as a metric
    router_version: str = "0.1.17"  # PyPI vllm-router, the P/D router the gateway fronts
    router_prometheus_port: Port = 29000
    # On the control machine: the plaintext client and admin keys (0600, generated when missing).
    # Only their SHA-256 hashes reach the gateway host.
    client_key_file: str = "~/.config/pdfleet/gateway-client.key"
    admin_key_file: str = "~/.config/pdfleet/gateway-admin.key"


class SloSpec(_Model):
    """P99 targets the rollout gates on."""

    ttft_p99_ms: float = Field(gt=0)
    tpot_p99_ms: float = Field(gt=0)
    itl_p99_ms: float = Field(gt=0)
    kv_transfer_p99_ms: float = Field(gt=0)


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
    # key path -> file that set it (this file or a base), so later errors point at the file to edit
    _origins: dict[tuple[str, ...], Path] = PrivateAttr(default_factory=dict)

    def origin_of(self, dotted: str) -> Path:
        """The profile file (itself or an `extends:` base) that set a key path, e.g. `pools.decode.gpus`."""
        return _origin(dotted, self.source, self._origins)

    @property
    def disaggregated(self) -> bool:
        """True for same-host and cross-host (prefill/decode pools joined by a KV connector)."""
        return self.topology != "colocated"

    def side_channel_port_for(self, pool: str) -> int | None:
        """See KVTransferSpec.side_channel_port_for; None for every pool of a colocated profile."""
        return self.kv_transfer.side_channel_port_for(pool) if self.disaggregated else None

    def kv_role_for(self, pool: str) -> str | None:
        """The kv_role rendered for a pool's instances (None: no --kv-transfer-config)."""
        spec = getattr(self.pools, pool)
        return spec.kv_role if spec is not None and self.disaggregated else None


# --------------------------------------------------------------------------- loading


class ProfileError(ValidationError):
    """A profile that does not validate; `problems` holds one `file: key.path: message` line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


Origins = dict[tuple[str, ...], Path]


def list_profiles(profiles_dir: Path) -> list[str]:
    """Runnable profile names in a directory (file stems, sorted; `_`-prefixed bases excluded)."""
    if not profiles_dir.is_dir():
        return []
    names = {p.stem for p in profiles_dir.iterdir() if p.suffix in PROFILE_SUFFIXES and p.is_file()}
    return sorted(name for name in names if not name.startswith(("_", ".")))


def _find(name: str, directory: Path) -> Path | None:
    """The file for a profile name in a directory, if any."""
    for suffix in PROFILE_SUFFIXES:
        candidate = directory / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def resolve_profile(name_or_path: str, profiles_dir: Path) -> Path:
    """A profile name (looked up in profiles_dir) or a path to a profile file."""
    as_path = Path(name_or_path)
    if as_path.suffix in PROFILE_SUFFIXES and ("/" in name_or_path or as_path.is_file()):
        if not as_path.is_file():
            raise ValidationError(f"{as_path}: profile file not found")
        return as_path
    if name_or_path.startswith("_"):
        raise ValidationError(
            f"profile {name_or_path!r} is a base for `extends:`, not a runnable profile; "
            f"available: {', '.join(list_profiles(profiles_dir)) or '(none)'}"
        )
    found = _find(name_or_path, profiles_dir)
    if found is None:
        raise ValidationError(
            f"unknown profile {name_or_path!r} in {profiles_dir}; "
            f"available: {', '.join(list_profiles(profiles_dir)) or '(none)'}"
        )
    return found


def _record_origins(data: Any, prefix: tuple[str, ...], source: Path, origins: Origins) -> None:
    """Note which file set each key path, so errors point at the file to edit."""
    origins[prefix] = source
    if isinstance(data, dict):
        for key, value in data.items():
            _record_origins(value, (*prefix, str(key)), source, origins)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key (override wins); anything else is replaced whole."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load_raw(path: Path, chain: list[Path], origins: Origins) -> dict[str, Any]:
    """One file's mapping with its `extends:` chain merged underneath; detects cycles and missing bases."""
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ProfileError(
            [f"{path}: (top level): must be a mapping of profile keys (got {type(data).__name__})"]
        )
    for reserved in ("name", "source"):
        if reserved in data:
            raise ProfileError([f"{path}: {reserved}: set by pdfleet from the file name; remove this key"])
    base_data: dict[str, Any] = {}
    base_name = data.get("extends")
    if base_name is not None:
        if not isinstance(base_name, str) or not base_name:
            raise ProfileError([f"{path}: extends: must be the name of another profile (got {base_name!r})"])
        base_path = _find(base_name, path.parent)
        if base_path is None:
            names = [p.stem for p in sorted(path.parent.iterdir()) if p.suffix in PROFILE_SUFFIXES]
            raise ProfileError(
                [f"{path}: extends: no profile {base_name!r} in {path.parent}; available: {', '.join(names)}"]
            )
        resolved = [p.resolve() for p in chain]
        if base_path.resolve() in resolved or base_path.resolve() == path.resolve():
            cycle = " -> ".join(p.stem for p in [*chain, path, base_path])
            raise ProfileError([f"{path}: extends: cycle {cycle}"])
        base_data = _load_raw(base_path, [*chain, path], origins)
    _record_origins(data, (), path, origins)
    return _deep_merge(base_data, data)


def load_profile(name_or_path: str, profiles_dir: Path) -> Profile:
    """Load, merge (`extends:`) and validate a profile; raises ProfileError listing every problem."""
    from pdfleet.model.checks import profile_problems

    path = resolve_profile(str(name_or_path), Path(profiles_dir))
    origins: Origins = {}
    data = _load_raw(path, [], origins)
    data.pop("extends", None)
    try:
        profile = Profile.model_validate(
            {**data, "name": path.stem, "source": path, "extends": _extends(path)}
        )
    except PydanticValidationError as exc:
        raise ProfileError(_format_pydantic(exc, path, origins)) from None
    profile._origins = origins
    problems = profile_problems(profile)
    if problems:
        raise ProfileError([f"{profile.origin_of(p.path)}: {p.path}: {p.message}" for p in problems])
    return profile


def raw_profile(name_or_path: str, profiles_dir: Path) -> dict[str, Any]:
    """The merged YAML of a profile without validation ({} if unreadable), for listings of bad profiles."""
    try:
        return _load_raw(resolve_profile(str(name_or_path), Path(profiles_dir)), [], {})
    except ValidationError:
        return {}


def check_against_inventory(profile: Profile, inventory: Inventory) -> None:
    """Semantic checks needing hosts (ports, GPUs, groups, RDMA devices); one error listing all problems."""
    from pdfleet.model.checks import inventory_problems

    problems = inventory_problems(profile, inventory)
    if problems:
        raise ProfileError([f"{profile.origin_of(p.path)}: {p.path}: {p.message}" for p in problems])


def _extends(path: Path) -> str | None:
    """The `extends:` value of the file itself (not of its bases), kept on the model for display."""
    data = read_yaml(path)
    return data.get("extends") if isinstance(data, dict) else None


# --------------------------------------------------------------------------- error formatting


def _origin(dotted: str, default: Path, origins: Origins) -> Path:
    """The file that set the longest prefix of a key path (the profile itself if none did)."""
    # "kv_transfer.side_channel_port+1" is reported against kv_transfer.side_channel_port
    parts = tuple(p.split("+")[0] for p in dotted.replace("[", ".").replace("]", "").split(".") if p)
    for end in range(len(parts), 0, -1):
        if parts[:end] in origins:
            return origins[parts[:end]]
    return default


def _dotted(loc: tuple[Any, ...]) -> str:
    """A pydantic location as `pools.prefill.gpus[1]`."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc` (to list its allowed keys)."""
    current: Any = Profile
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:
            current = _container_item(current)
        current = _unwrap(current)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional/Annotated to the model or container type underneath."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else annotation
            if len(args) != 1:
                return annotation
        else:
            return annotation


def _container_item(annotation: Any) -> Any:
    """The item type of list[X] / dict[str, X]."""
    args = typing.get_args(annotation)
    return args[-1] if args else None


def _allowed_keys(loc: tuple[Any, ...]) -> str:
    """The keys a mapping at `loc` accepts, for unknown-key errors."""
    model = _model_at(loc)
    if model is None:
        return ""
    keys = [k for k in model.model_fields if not (model is Profile and k in ("name", "source"))]
    return "; allowed: " + ", ".join(keys)


def _message(err: dict[str, Any]) -> str:
    """A short operator-facing message for one pydantic error."""
    kind, ctx, value = err["type"], err.get("ctx", {}), err.get("input")
    got = f" (got {value!r})" if not isinstance(value, dict | list) else ""
    bounds = {"less_than_equal": "<=", "less_than": "<", "greater_than": ">", "greater_than_equal": ">="}
    if kind in bounds:
        key = {"<=": "le", "<": "lt", ">": "gt", ">=": "ge"}[bounds[kind]]
        return f"must be {bounds[kind]} {ctx.get(key)}{got}"
    simple = {
        "int_type": "must be an integer",
        "float_type": "must be a number",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping",
        "string_pattern_mismatch": f"must match {ctx.get('pattern')}",
    }
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind in simple:
        return simple[kind] + got
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}{got}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return err["msg"][0].lower() + err["msg"][1:] + got


def _format_pydantic(exc: PydanticValidationError, path: Path, origins: Origins) -> list[str]:
    """`file: key.path: message` lines, one per distinct error location."""
    lines: list[str] = []
    seen: set[str] = set()
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        dotted = _dotted(loc)
        if dotted in seen:
            continue
        seen.add(dotted)
        message = _message(err)
        if err["type"] == "extra_forbidden":
            message += _allowed_keys(loc[:-1])
        lines.append(f"{_origin(dotted, path, origins)}: {dotted}: {message}")
    return lines
