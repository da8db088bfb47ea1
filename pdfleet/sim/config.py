"""A simulator process's validated configuration (`SimConfig`), built from `serve` options and vLLM's env.

`parse_serve_args(argv)` turns the words after `serve` into a validated `SimConfig`; errors are
`pdfleet.errors.ValidationError` with argparse's wording ("unrecognized arguments: --foo", from
`pdfleet.sim.serve_options`) or vLLM's (kv_role missing, max_model_len too large for the KV cache, ...),
so a typo in a rendered unit fails in the lab the way it would fail on a GPU host. `SimConfig` also
derives what the engine needs from those options: the step-time model and the scheduler limits.
"""

from __future__ import annotations

import argparse
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.model import catalog
from pdfleet.model.catalog import GpuRoofline, LinkSpec, ModelShape
from pdfleet.model.vllm_kv_events import event_format
from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.model.vllm_releases import Release
from pdfleet.sim.engine import Engine, EngineLimits
from pdfleet.sim.kv_events import KvEventsSettings, parse_kv_events_config
from pdfleet.sim.kv_library import LibrarySettings, settings_from_env
from pdfleet.sim.model_dir import ModelDir, can_run_tokenizers, read_model_dir
from pdfleet.sim.perf import PerfModel
from pdfleet.sim.serve_options import parse_argv, release_named

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
# What vLLM 0.11.1/0.11.2 do with a failed KV load (no kv_load_failure_policy field yet): they mark the
# blocks invalid and the scheduler recomputes them; 0.11.0 reports no load errors, so nothing is recomputed.
NO_POLICY_FIELD = "recompute"
MOONCAKE_PORT_ENV = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
MOONCAKE_TIMEOUT_ENV = "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT"


@dataclass(frozen=True)
class KVTransfer:
    """The parts of --kv-transfer-config the simulator acts on."""

    connector: str
    role: str
    engine_id: str
    buffer_device: str
    load_failure_policy: str
    extra_config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_producer(self) -> bool:
        """This instance prefills for a remote decoder (kv_producer or kv_both)."""
        return self.role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        """This instance decodes from remote KV (kv_consumer or kv_both)."""
        return self.role in ("kv_consumer", "kv_both")


@dataclass(frozen=True)
class SimConfig:
    """Everything a simulator process needs, validated."""

    model: str
    served_model_names: tuple[str, ...]
    host: str | None
    port: int
    api_keys: tuple[str, ...]
    tensor_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    kv_cache_dtype: str
    block_size: int
    num_blocks: int
    long_prefill_token_threshold: int
    kv_transfer: KVTransfer | None
    gpu: GpuRoofline
    link: LinkSpec
    model_spec: ModelShape
    time_scale: float
    side_channel_host: str
    side_channel_port: int
    abort_timeout_s: float
    tokenizer: str | None
    chars_per_token: float
    disable_log_stats: bool
    log_interval_s: float
    visible_devices: tuple[str, ...] | None
    mooncake_bootstrap_port: int = 8998  # VLLM_MOONCAKE_BOOTSTRAP_PORT (a Mooncake producer's)
    kv_events: KvEventsSettings | None = None  # --kv-events-config's publisher (None: events off)
    kv_library: LibrarySettings | None = None  # real KV bytes: NIXL or Mooncake (kv-transfer.env; None: off)
    release: Release = field(default=RELEASES[NEWEST], repr=False)  # modelled (--sim-vllm-version)
    model_dir: ModelDir | None = None  # a local model directory's config and tokenizer (a staged model)
    chat_template: str | None = None  # --chat-template: a file or the template (None: the tokenizer's)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token takes over the whole model (all TP ranks), at the cache dtype."""
        return self.model_spec.kv_bytes_per_token(catalog.KV_CACHE_DTYPES[self.kv_cache_dtype])

    def perf(self) -> PerfModel:
        """The step-time model for this GPU, model and TP size."""
        return PerfModel(self.gpu, self.model_spec, self.tensor_parallel_size, self.kv_bytes_per_token)

    def limits(self) -> EngineLimits:
        """The scheduler limits these options set."""
        kv = self.kv_transfer
        return EngineLimits(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            hold_timeout_s=self.abort_timeout_s,
            # recomputing needs the worker to report the blocks it could not load (not 0.11.0)
            recompute_on_load_failure=bool(kv and kv.load_failure_policy == "recompute")
            and self.release.handshake.reports_load_errors,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_stats_skip_preempted=self.release.prefix_caching.preempted_apart,
        )

    def engine(self) -> Engine:
        """A fresh engine for this configuration."""
        return Engine(self.perf(), self.limits())


def parse_serve_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimConfig:
    """Parse and validate `serve` options (words after `serve`; a leading program/`serve` is skipped)."""
    env = os.environ if env is None else env
    ns = parse_argv(argv)
    model_id = ns.model_opt or ns.model_tag
    if not model_id:
        raise ValidationError("pdfleet-sim serve: error: the following arguments are required: model_tag")
    model_dir = read_model_dir(model_id) if os.path.isdir(model_id) else None
    spec = _catalog_model(model_id, model_dir, ns.served_model_name or ())
    gpu = catalog.gpu(ns.sim_gpu)
    link = catalog.link(ns.sim_link)
    if not ns.sim_time_scale > 0:
        raise ValidationError(f"--sim-time-scale {ns.sim_time_scale}: must be > 0")
    if not 0 < ns.gpu_memory_utilization <= 1:
        raise ValidationError(f"--gpu-memory-utilization {ns.gpu_memory_utilization}: must be in (0, 1]")
    tp = ns.tensor_parallel_size
    visible = _visible_devices(env)
    if tp < 1:
        raise ValidationError(f"--tensor-parallel-size {tp}: must be >= 1")
    if visible is not None and tp > len(visible):
        raise ValidationError(
            f"tensor_parallel_size ({tp}) is larger than the number of GPUs in CUDA_VISIBLE_DEVICES "
            f"({','.join(visible) or 'empty'})"
        )
    derived, where = (
        (model_dir.max_len, f"{model_dir.max_len_key}={model_dir.max_len} in {model_dir.config_file}")
        if model_dir
        else (spec.max_model_len, f"max_position_embeddings={spec.max_model_len} of {spec.name}")
    )
    max_model_len = ns.max_model_len or derived
    if max_model_len > derived and not (model_dir and model_dir.max_len_key == "default"):
        raise ValidationError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"({where})"
        )
    rel = release_named(ns.sim_vllm_version)
    tier = rel.batch_tier(gpu.memory_bytes / catalog.GIB, gpu.name)  # get_batch_defaults, API server
    chunked = True if ns.enable_chunked_prefill is None else ns.enable_chunked_prefill
    if rel.chunked_prefill.forced_on:
        chunked = True  # EngineArgs sets it back on for generative models, whatever the flag said
    factor = rel.mode_factor(ns.performance_mode)  # 0.33's throughput mode doubles both defaults
    batched = ns.max_num_batched_tokens
    if batched is None:
        scaled = tier.max_num_batched_tokens * factor
        batched = scaled if chunked else max(max_model_len, scaled)
    # a defaulted max_num_seqs is capped by max_num_batched_tokens (the table's max_num_seqs_rule)
    max_seqs = ns.max_num_seqs or min(tier.max_num_seqs * factor, batched)
    if not chunked and batched < max_model_len:
        raise ValidationError(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}). This "
            "effectively limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject "
            "longer sequences. Please increase max_num_batched_tokens or decrease max_model_len."
        )
    if batched < max_seqs:
        raise ValidationError(
            f"max_num_batched_tokens ({batched}) must be greater than or equal to max_num_seqs ({max_seqs})."
        )
    kv_dtype_bytes = _kv_dtype_bytes(ns.kv_cache_dtype, rel)
    num_blocks = _num_blocks(ns, spec, gpu, tp, kv_dtype_bytes, max_model_len)
    kv = _kv_transfer(ns.kv_transfer_config, rel)
    timeout = _hold_s(env, kv, rel)
    keys = tuple(ns.api_key or ([env["VLLM_API_KEY"]] if env.get("VLLM_API_KEY") else []))
    return SimConfig(
        model=model_id,
        served_model_names=tuple(ns.served_model_name or [model_id]),
        host=ns.host,
        port=ns.port,
        api_keys=keys,
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=batched,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        enable_chunked_prefill=chunked,
        # unset: the release's default (0.11 True; 0.33 is_prefix_caching_supported, True for the
        # decoder-only models the simulator knows)
        enable_prefix_caching=True if ns.enable_prefix_caching is None else ns.enable_prefix_caching,
        kv_cache_dtype=ns.kv_cache_dtype,
        block_size=ns.block_size,
        num_blocks=num_blocks,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        kv_transfer=kv,
        gpu=gpu,
        link=link,
        model_spec=spec,
        time_scale=ns.sim_time_scale,
        side_channel_host=env.get(
            "VLLM_NIXL_SIDE_CHANNEL_HOST", str(rel.env_default("VLLM_NIXL_SIDE_CHANNEL_HOST"))
        ),
        side_channel_port=_env_int(
            env,
            "VLLM_NIXL_SIDE_CHANNEL_PORT",
            int(rel.env_number("VLLM_NIXL_SIDE_CHANNEL_PORT")),
        ),
        abort_timeout_s=timeout,
        # vLLM's tokenizer defaults to the model's directory; the simulator runs it when it can
        tokenizer=ns.tokenizer or (model_dir.tokenizer_file if model_dir and can_run_tokenizers() else None),
        chars_per_token=ns.sim_chars_per_token,
        disable_log_stats=ns.disable_log_stats,
        log_interval_s=ns.sim_log_interval,
        visible_devices=visible,
        mooncake_bootstrap_port=_env_int(env, MOONCAKE_PORT_ENV, int(rel.env_number(MOONCAKE_PORT_ENV)))
        if rel.has_env(MOONCAKE_PORT_ENV)
        else 8998,
        kv_events=_kv_events(ns.kv_events_config, rel),
        kv_library=settings_from_env(env),
        release=rel,
        chat_template=ns.chat_template,
        model_dir=model_dir,
    )


def _catalog_model(model: str, model_dir: ModelDir | None, served: Sequence[str]) -> ModelShape:
    """The catalog's shape of the model: by the id or path's last part; a local directory (a staged
    revision's, `<id>/<revision>`) whose last part names none is known by its first served name that does."""
    try:
        return catalog.model(model)
    except ValidationError:
        for name in served if model_dir else ():
            try:
                return catalog.model(name)
            except ValidationError:
                continue
        raise


def _kv_events(text: str | None, rel: Release) -> KvEventsSettings | None:
    """--kv-events-config as the release reads it (a release whose format is not tabled: refused)."""
    fmt = event_format(rel.version)
    if fmt is None:
        if text:
            raise ValidationError(f"--kv-events-config: vLLM {rel.version}'s KV event format is not tabled")
        return None
    return parse_kv_events_config(text, fmt)


def _kv_dtype_bytes(dtype: str, rel: Release) -> int | None:
    """The KV element size of a --kv-cache-dtype the release takes (None: the model's dtype). A value
    outside the release's CacheDType fails as vLLM's CacheConfig fails it; one the release takes but the
    catalog has no size for is refused as the simulator's own limit, not vLLM's."""
    flag = rel.serve_flag("--kv-cache-dtype")
    if flag is not None and flag.choices and dtype not in flag.choices:
        raise ValidationError(f"Invalid kv_cache_dtype: {dtype!r}. Valid values are: {list(flag.choices)}")
    if dtype not in catalog.KV_CACHE_DTYPES:
        raise ValidationError(
            f"--kv-cache-dtype {dtype}: vLLM {rel.version} takes it, but the simulator has no KV element "
            f"size for it (it models {', '.join(catalog.KV_CACHE_DTYPES)})"
        )
    return catalog.KV_CACHE_DTYPES[dtype]


def _visible_devices(env: Mapping[str, str]) -> tuple[str, ...] | None:
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return tuple(d.strip() for d in raw.split(",") if d.strip())


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValidationError(f"environment variable {name}={raw!r}: not an integer") from exc


def _num_blocks(
    ns: argparse.Namespace,
    spec: ModelShape,
    gpu: GpuRoofline,
    tp: int,
    kv_dtype_bytes: int | None,
    max_model_len: int,
) -> int:
    """KV blocks per GPU: (utilisation × memory − weights/tp − reserve) / (block bytes per GPU)."""
    block_bytes = ns.block_size * spec.kv_bytes_per_token(kv_dtype_bytes) / tp
    if ns.num_gpu_blocks_override:
        blocks = ns.num_gpu_blocks_override
    else:
        free = (
            ns.gpu_memory_utilization * gpu.memory_bytes
            - spec.weight_bytes / tp
            - catalog.NON_KV_RESERVE_BYTES
        )
        if free <= 0:
            need = (spec.weight_bytes / tp + catalog.NON_KV_RESERVE_BYTES) / catalog.GIB
            raise ValidationError(
                f"No available memory for the cache blocks: {spec.name} needs {need:.1f} GiB per GPU at "
                f"tensor_parallel_size={tp}, but {gpu.name} × gpu_memory_utilization "
                f"{ns.gpu_memory_utilization} gives "
                f"{ns.gpu_memory_utilization * gpu.memory_bytes / catalog.GIB:.1f} GiB. Try increasing "
                "gpu_memory_utilization or tensor_parallel_size."
            )
        blocks = int(free // block_bytes)
    capacity = blocks * ns.block_size
    if capacity < max_model_len:
        raise ValidationError(
            f"The model's max seq len ({max_model_len}) is larger than the maximum number of tokens that can "
            f"be stored in KV cache ({capacity}). Try increasing gpu_memory_utilization or decreasing "
            "max_model_len when initializing the engine."
        )
    return blocks


def _kv_transfer(raw: str | None, rel: Release) -> KVTransfer | None:
    """Validate --kv-transfer-config as the release's KVTransferConfig does."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"--kv-transfer-config: not valid JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(data, dict):
        raise ValidationError("--kv-transfer-config: must be a JSON object")
    fields = set(rel.config_keys())
    unknown = sorted(set(data) - fields)
    if unknown and rel.kv_transfer_config.unknown_keys == "forbid":
        raise ValidationError(
            f"--kv-transfer-config: unknown field(s) {', '.join(unknown)} for KVTransferConfig "
            f"(vLLM {rel.version})"
        )
    data = {key: value for key, value in data.items() if key in fields}  # 0.11: ignored silently
    connector = data.get("kv_connector")
    role = data.get("kv_role")
    if connector is None:
        return None
    if role is None:
        # the release's own words (0.11.0 asks for "kv_disagg_role")
        words = rel.kv_transfer_config.missing_role or "Please specify kv_role when kv_connector is set"
        raise ValidationError(f"--kv-transfer-config: {words} {list(KV_ROLES)}")
    if role not in KV_ROLES:
        raise ValidationError(f"--kv-transfer-config: kv_role {role!r}: supported roles are {list(KV_ROLES)}")
    if not rel.has_connector(connector) and not data.get("kv_connector_module_path"):
        raise ValidationError(f"--kv-transfer-config: Unsupported connector type: {connector}")
    default_policy = "fail" if "kv_load_failure_policy" in fields else NO_POLICY_FIELD
    policy = data.get("kv_load_failure_policy", default_policy)
    if policy not in ("recompute", "fail"):
        raise ValidationError(
            f"--kv-transfer-config: kv_load_failure_policy {policy!r}: must be recompute or fail"
        )
    device = data.get("kv_buffer_device", "cuda")
    allowed = rel.buffer_devices_on("cuda")
    if connector == "NixlConnector" and device not in allowed:
        raise ValidationError(
            f"--kv-transfer-config: kv_buffer_device {device!r} is not supported by NixlConnector on cuda "
            f"(vLLM {rel.version} supports {', '.join(allowed)})"
        )
    extra = data.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValidationError("--kv-transfer-config: kv_connector_extra_config must be an object")
    return KVTransfer(connector, role, str(data.get("engine_id") or uuid.uuid4()), device, policy, extra)


def _hold_s(env: Mapping[str, str], kv: KVTransfer | None, rel: Release) -> float:
    """How long a producer holds blocks for its consumer: the release's abort timeout (0.11, env var) or
    lease (0.33, kv_connector_extra_config.kv_lease_duration, renewed by the consumer's heartbeats)."""
    kind, default = rel.kv_hold_s()
    raw: Any
    if kv is not None and kv.connector == "MooncakeConnector":  # its own fixed hold (mooncake_connector.py)
        raw = env.get(MOONCAKE_TIMEOUT_ENV) or rel.env_default(MOONCAKE_TIMEOUT_ENV)
        name = MOONCAKE_TIMEOUT_ENV
    elif kind == "lease":
        raw = (kv.extra_config if kv is not None else {}).get("kv_lease_duration", default)
        name = "kv_connector_extra_config.kv_lease_duration"
    else:
        raw = env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT") or default
        name = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"
    try:
        value = float(raw)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name}={raw!r}: not a number") from exc
    if not value > 0:
        raise ValidationError(f"{name}={raw!r}: must be > 0")
    return value


def describe(cfg: SimConfig) -> str:
    """One line for the start-up log: what is being simulated and with how much KV cache."""
    return (
        f"{cfg.model_spec.name} on {cfg.tensor_parallel_size}x {cfg.gpu.name}: {cfg.num_blocks} KV blocks "
        f"({cfg.num_blocks * cfg.block_size} tokens), max_num_batched_tokens={cfg.max_num_batched_tokens}, "
        f"max_num_seqs={cfg.max_num_seqs}, chunked_prefill={cfg.enable_chunked_prefill}, "
        f"link={cfg.link.name}, time_scale={cfg.time_scale}"
        + (f", kv_role={cfg.kv_transfer.role}" if cfg.kv_transfer else "")
    )
