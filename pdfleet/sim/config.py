"""`pdfleet-sim serve` options: vLLM's `vllm serve` options (unknown ones rejected as vLLM does) plus --sim-*.

`parse_serve_args(argv)` turns the words after `serve` into a validated `SimConfig`; errors are
`pdfleet.errors.ValidationError` with argparse's wording ("unrecognized arguments: --foo") or vLLM's
(kv_role missing, max_model_len too large for the KV cache, ...), so a typo in a rendered unit fails
in the lab the way it would fail on a GPU host.
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
from pdfleet.model.catalog import GpuSpec, LinkSpec, ModelSpec
from pdfleet.model.connectors import (  # connector names some vLLM version registers; vLLM's NIXL defaults
    ALL_KNOWN,
    NIXL_SIDE_CHANNEL_HOST,
    NIXL_SIDE_CHANNEL_PORT,
)
from pdfleet.sim.engine import DEFAULT_HOLD_TIMEOUT_S, Engine, EngineLimits
from pdfleet.sim.perf import PerfModel
from pdfleet.tokens import DEFAULT_CHARS_PER_TOKEN

TIME_SCALE_HELP = (
    "Wall-clock seconds per simulated second (0.1 = ten times faster). Everything the simulator "
    "reports -- Prometheus metrics, log lines, lease timeouts -- is in SIMULATED seconds, i.e. what the "
    "GPU would show; only the pacing of responses is scaled."
)

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_TRANSFER_FIELDS = frozenset(
    {
        "kv_connector",
        "engine_id",
        "kv_buffer_device",
        "kv_buffer_size",
        "kv_role",
        "kv_rank",
        "kv_parallel_size",
        "kv_ip",
        "kv_port",
        "kv_connector_extra_config",
        "kv_connector_module_path",
        "enable_permute_local_kv",
        "kv_load_failure_policy",
    }
)

# vLLM serve options the simulator accepts and ignores (no effect on timing or API), by argument shape.
_IGNORED_VALUE = (
    "--tokenizer-mode",
    "--revision",
    "--code-revision",
    "--tokenizer-revision",
    "--dtype",
    "--seed",
    "--download-dir",
    "--load-format",
    "--config-format",
    "--quantization",
    "--pipeline-parallel-size",
    "-pp",
    "--data-parallel-size",
    "-dp",
    "--data-parallel-size-local",
    "--data-parallel-address",
    "--data-parallel-rpc-port",
    "--data-parallel-start-rank",
    "--data-parallel-backend",
    "--swap-space",
    "--cpu-offload-gb",
    "--max-logprobs",
    "--chat-template",
    "--chat-template-content-format",
    "--response-role",
    "--root-path",
    "--uvicorn-log-level",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
    "--ssl-cert-reqs",
    "--max-num-partial-prefills",
    "--max-long-partial-prefills",
    "--scheduling-policy",
    "--distributed-executor-backend",
    "--compilation-config",
    "-O",
    "--generation-config",
    "--override-generation-config",
    "--hf-overrides",
    "--max-lora-rank",
    "--max-loras",
    "--max-cpu-loras",
    "--tool-call-parser",
    "--tool-parser-plugin",
    "--reasoning-parser",
    "--guided-decoding-backend",
    "--structured-outputs-config",
    "--speculative-config",
    "--kv-events-config",
    "--otlp-traces-endpoint",
    "--collect-detailed-traces",
    "--show-hidden-metrics-for-version",
    "--prefix-caching-hash-algo",
    "--max-seq-len-to-capture",
    "--max-parallel-loading-workers",
    "--logits-processor-pattern",
    "--limit-mm-per-prompt",
    "--mm-processor-kwargs",
    "--api-server-count",
    "-asc",
    "--worker-cls",
    "--worker-extension-cls",
    "--model-impl",
    "--max-cudagraph-capture-size",
    "--kv-cache-memory-bytes",
    "--log-config-file",
    "--uds",
    "--tokenizer-pool-size",
    "--max-log-len",
    "--middleware",
    "--lora-dtype",
    "--override-pooler-config",
    "--pooler-config",
    "--task",
    "--runner",
    "--convert",
    "--stream-interval",
    "--mamba-ssm-cache-dtype",
    "--ray-workers-use-nsight",
    "--quantization-param-path",
    "--allowed-local-media-path",
    "--allowed-media-domains",
)
_IGNORED_LIST = (
    "--lora-modules",
    "--prompt-adapters",
    "--allowed-origins",
    "--allowed-methods",
    "--allowed-headers",
    "--cuda-graph-sizes",  # deprecated spelling of --cudagraph-capture-sizes
    "--cudagraph-capture-sizes",
)
_IGNORED_BOOL = (
    "--trust-remote-code",
    "--enforce-eager",
    "--disable-log-requests",
    "--enable-log-requests",
    "--disable-custom-all-reduce",
    "--enable-prefix-caching",
    "--calculate-kv-scales",
    "--disable-frontend-multiprocessing",
    "--enable-auto-tool-choice",
    "--return-tokens-as-token-ids",
    "--disable-fastapi-docs",
    "--enable-prompt-tokens-details",
    "--enable-force-include-usage",
    "--enable-server-load-tracking",
    "--enable-request-id-headers",
    "--enable-expert-parallel",
    "--headless",
    "--disable-sliding-window",
    "--skip-tokenizer-init",
    "--enable-sleep-mode",
    "--disable-mm-preprocessor-cache",
    "--async-scheduling",
    "--enable-lora",
    "--allow-credentials",
    "--disable-uvicorn-access-log",
    "--enable-log-outputs",
    "--fully-sharded-loras",
    "--disable-cascade-attn",
    "--enable-tokenizer-info-endpoint",
    "--enable-dbo",
)


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
        return self.role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
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
    kv_cache_dtype: str
    block_size: int
    num_blocks: int
    long_prefill_token_threshold: int
    kv_transfer: KVTransfer | None
    gpu: GpuSpec
    link: LinkSpec
    model_spec: ModelSpec
    time_scale: float
    side_channel_host: str
    side_channel_port: int
    abort_timeout_s: float
    tokenizer: str | None
    chars_per_token: float
    disable_log_stats: bool
    log_interval_s: float
    visible_devices: tuple[str, ...] | None

    @property
    def kv_bytes_per_token(self) -> int:
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
            recompute_on_load_failure=bool(kv and kv.load_failure_policy == "recompute"),
        )

    def engine(self) -> Engine:
        """A fresh engine for this configuration."""
        return Engine(self.perf(), self.limits())


class _Parser(argparse.ArgumentParser):
    """argparse that raises ValidationError instead of exiting, so callers decide what to print."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValidationError(f"pdfleet-sim serve: error: {message}")


def build_parser() -> argparse.ArgumentParser:
    """The `serve` option parser: vLLM's options (honoured or ignored) and the simulator's own."""
    p = _Parser(
        prog="pdfleet-sim serve",
        allow_abbrev=False,
        description="Serve a simulated vLLM OpenAI-compatible API. " + TIME_SCALE_HELP,
    )
    p.add_argument("model_tag", nargs="?", help="model id or path (as `vllm serve MODEL`)")
    p.add_argument("--model", dest="model_opt", help="model id or path (alternative to the positional)")
    p.add_argument("--host", default=None, help="bind address (default: all interfaces, as vLLM)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--tokenizer", default=None, help="tokenizer.json file or a directory holding one")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--max-model-len", type=_human_int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=_human_int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--kv-cache-dtype", default="auto", choices=sorted(catalog.KV_CACHE_DTYPES))
    p.add_argument(
        "--block-size", type=int, default=catalog.DEFAULT_BLOCK_SIZE, choices=[1, 8, 16, 32, 64, 128]
    )
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--long-prefill-token-threshold", type=int, default=0)
    p.add_argument("--kv-transfer-config", default=None, help="JSON, as vLLM's KVTransferConfig")
    p.add_argument("--disable-log-stats", action=argparse.BooleanOptionalAction, default=False)
    for flag in _IGNORED_VALUE:
        p.add_argument(flag, dest=_ignored_dest(flag), default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_LIST:
        p.add_argument(flag, dest=_ignored_dest(flag), nargs="*", default=None, help=argparse.SUPPRESS)
    for flag in _IGNORED_BOOL:
        p.add_argument(
            flag,
            dest=_ignored_dest(flag),
            action=argparse.BooleanOptionalAction,
            default=None,
            help=argparse.SUPPRESS,
        )
    sim = p.add_argument_group("simulator")
    sim.add_argument("--sim-gpu", default="H100-SXM", help=f"GPU to simulate: {', '.join(catalog.GPUS)}")
    sim.add_argument(
        "--sim-link",
        default="tcp",
        help=f"link KV blocks travel over (consumer side): {', '.join(catalog.LINKS)}",
    )
    sim.add_argument("--sim-time-scale", type=float, default=1.0, help=TIME_SCALE_HELP)
    sim.add_argument(
        "--sim-chars-per-token",
        type=float,
        default=DEFAULT_CHARS_PER_TOKEN,
        help="prompt-token estimate without a tokenizer (pdfleet.tokens; the gateway's default)",
    )
    sim.add_argument(
        "--sim-log-interval",
        type=float,
        default=10.0,
        help="simulated seconds between periodic stats/KV-transfer log lines",
    )
    return p


def _ignored_dest(flag: str) -> str:
    return "ignored_" + flag.lstrip("-").replace("-", "_")


def _human_int(text: str) -> int:
    """Integers as vLLM accepts them for lengths: plain, or with k/K/m/M suffixes (1k = 1000, 1K = 1024)."""
    mult = {"k": 1000, "m": 1000**2, "K": 1024, "M": 1024**2}
    try:
        if text and text[-1] in mult:
            return int(float(text[:-1]) * mult[text[-1]])
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from exc


def _normalise(argv: Sequence[str]) -> list[str]:
    """Drop a leading program path / `serve`, and accept --opt_name like vLLM (underscores → dashes)."""
    words = list(argv)
    if words and os.path.basename(words[0]) in ("pdfleet-sim", "vllm"):
        words = words[1:]
    if words and words[0] == "serve":
        words = words[1:]
    out = []
    for w in words:
        if w.startswith("--") and not w.startswith("---"):
            key, eq, val = w.partition("=")
            w = key.replace("_", "-") + eq + val
        out.append(w)
    return out


def parse_serve_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimConfig:
    """Parse and validate `serve` options (words after `serve`; a leading program/`serve` is skipped)."""
    env = os.environ if env is None else env
    ns = build_parser().parse_args(_normalise(argv))
    model_id = ns.model_opt or ns.model_tag
    if not model_id:
        raise ValidationError("pdfleet-sim serve: error: the following arguments are required: model_tag")
    spec = catalog.model(model_id)
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
    max_model_len = ns.max_model_len or spec.max_model_len
    if max_model_len > spec.max_model_len:
        raise ValidationError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
            f"(max_position_embeddings={spec.max_model_len}) of {spec.name}"
        )
    big_gpu = gpu.memory_bytes >= 70 * catalog.GIB and "a100" not in gpu.name.lower()
    chunked = True if ns.enable_chunked_prefill is None else ns.enable_chunked_prefill
    max_seqs = ns.max_num_seqs or (1024 if big_gpu else 256)  # vLLM get_batch_defaults, API server
    batched = ns.max_num_batched_tokens
    if batched is None:
        batched = (8192 if big_gpu else 2048) if chunked else max(max_model_len, 2048)
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
    kv_dtype_bytes = catalog.KV_CACHE_DTYPES[ns.kv_cache_dtype]
    num_blocks = _num_blocks(ns, spec, gpu, tp, kv_dtype_bytes, max_model_len)
    kv = _kv_transfer(ns.kv_transfer_config)
    timeout = _abort_timeout(env, kv)
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
        kv_cache_dtype=ns.kv_cache_dtype,
        block_size=ns.block_size,
        num_blocks=num_blocks,
        long_prefill_token_threshold=ns.long_prefill_token_threshold,
        kv_transfer=kv,
        gpu=gpu,
        link=link,
        model_spec=spec,
        time_scale=ns.sim_time_scale,
        side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", NIXL_SIDE_CHANNEL_HOST),
        side_channel_port=_env_int(env, "VLLM_NIXL_SIDE_CHANNEL_PORT", NIXL_SIDE_CHANNEL_PORT),
        abort_timeout_s=timeout,
        tokenizer=ns.tokenizer,
        chars_per_token=ns.sim_chars_per_token,
        disable_log_stats=ns.disable_log_stats,
        log_interval_s=ns.sim_log_interval,
        visible_devices=visible,
    )


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
    spec: ModelSpec,
    gpu: GpuSpec,
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


def _kv_transfer(raw: str | None) -> KVTransfer | None:
    """Validate --kv-transfer-config as vLLM's KVTransferConfig does."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"--kv-transfer-config: not valid JSON ({exc.msg} at char {exc.pos})") from exc
    if not isinstance(data, dict):
        raise ValidationError("--kv-transfer-config: must be a JSON object")
    unknown = sorted(set(data) - KV_TRANSFER_FIELDS)
    if unknown:
        raise ValidationError(
            f"--kv-transfer-config: unknown field(s) {', '.join(unknown)} for KVTransferConfig"
        )
    connector = data.get("kv_connector")
    role = data.get("kv_role")
    if connector is None:
        return None
    if role is None:
        raise ValidationError(
            "--kv-transfer-config: Please specify kv_role when kv_connector is set, supported roles are "
            f"{list(KV_ROLES)}"
        )
    if role not in KV_ROLES:
        raise ValidationError(f"--kv-transfer-config: kv_role {role!r}: supported roles are {list(KV_ROLES)}")
    if connector not in ALL_KNOWN and not data.get("kv_connector_module_path"):
        raise ValidationError(f"--kv-transfer-config: Unsupported connector type: {connector}")
    policy = data.get("kv_load_failure_policy", "fail")
    if policy not in ("recompute", "fail"):
        raise ValidationError(
            f"--kv-transfer-config: kv_load_failure_policy {policy!r}: must be recompute or fail"
        )
    device = data.get("kv_buffer_device", "cuda")
    if device not in ("cuda", "cpu", "xpu"):
        raise ValidationError(f"--kv-transfer-config: kv_buffer_device {device!r}: must be cuda, cpu or xpu")
    extra = data.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ValidationError("--kv-transfer-config: kv_connector_extra_config must be an object")
    return KVTransfer(connector, role, str(data.get("engine_id") or uuid.uuid4()), device, policy, extra)


def _abort_timeout(env: Mapping[str, str], kv: KVTransfer | None) -> float:
    """How long a producer holds blocks for its consumer: kv_lease_duration, else the abort-timeout env."""
    if kv is not None and "kv_lease_duration" in kv.extra_config:
        return float(kv.extra_config["kv_lease_duration"])
    raw = env.get("VLLM_NIXL_ABORT_REQUEST_TIMEOUT")
    if raw:
        try:
            return float(raw)
        except ValueError as exc:
            raise ValidationError(f"VLLM_NIXL_ABORT_REQUEST_TIMEOUT={raw!r}: not a number") from exc
    return DEFAULT_HOLD_TIMEOUT_S


def describe(cfg: SimConfig) -> str:
    """One line for the start-up log: what is being simulated and with how much KV cache."""
    return (
        f"{cfg.model_spec.name} on {cfg.tensor_parallel_size}x {cfg.gpu.name}: {cfg.num_blocks} KV blocks "
        f"({cfg.num_blocks * cfg.block_size} tokens), max_num_batched_tokens={cfg.max_num_batched_tokens}, "
        f"max_num_seqs={cfg.max_num_seqs}, chunked_prefill={cfg.enable_chunked_prefill}, "
        f"link={cfg.link.name}, time_scale={cfg.time_scale}"
        + (f", kv_role={cfg.kv_transfer.role}" if cfg.kv_transfer else "")
    )
