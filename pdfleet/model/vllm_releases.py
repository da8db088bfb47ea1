"""What pdfleet knows about each vLLM release it supports: one table, read from vLLM's own wheel.

The rows live in `vllm_release_data` (written by `tools/vllm_facts.py --write` from the wheel's .py
sources, never by hand; the script's diff against it is the review). Each row names the vLLM file it
comes from (`source`, a path inside the wheel). This module holds the row types and the questions
rendering (`fleet.vllm_args`), profile checks (`model.checks`) and the simulator (`sim`) ask of a pin.
Values are kept as vLLM spells them (names, env vars, defaults), so nothing is translated twice.

`serve_flags` is the `vllm serve` option set, read as `get_kwargs` would build it from the config
dataclasses' field annotations (plugins and `current_platform.pre_register_and_update` can add more at
run time; those are not tabled). `metrics` holds what the engine's stat logger and the NIXL and Mooncake
connectors register, with kinds, labels and buckets; `other_metrics` names every other `vllm:` family the
sources declare (speculative decoding's among them: pdfleet renders none), so none is missing from the
table. Not tabled, with the reason: what the `nixl` wheel's cu12/cu13 extras install (PyPI metadata of nixl,
not vLLM source: the minimum version vLLM checks is `handshake.min_nixl`).

Issue 12's rows that are not a profile check, with the reason: P and D on different releases — a
profile has one `vllm.version` for every pool, so no profile can pin them apart; the mismatch arises
only mid-upgrade, and the simulator models it (the compatibility hash carries the version where
`handshake.hash_factors` has it). The side-channel default port (5557 vs 5600) — pdfleet always
renders `VLLM_NIXL_SIDE_CHANNEL_PORT` (the profile's `kv_transfer.side_channel_port`), so vLLM's default
never applies to a unit; the simulator uses the release's default when the variable is unset.

Where the shared reference (vllm-pd.md) disagrees with the 0.11.0 wheel, the wheel is right and the
reference describes 0.11.1+ (whose rows match it): `VLLM_NIXL_SIDE_CHANNEL_PORT` defaults to 5557 in
0.11.0 with a listener per TP rank (base + dp_rank * tp_size + tp_rank), not 5600 with one listener;
`VLLM_NIXL_ABORT_REQUEST_TIMEOUT` is 120 s in 0.11.0 (PR #25897's 480 s landed after the 0.11.0 cut);
and 0.11.0's handshake query sets no 5 s receive timeout (`handshake.receive_timeout_ms` None).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass

from pdfleet.model.vllm_metric_rows import Metric, OtherMetrics, TransferLog

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class Connector:
    """A name `KVConnectorFactory.register_connector` registers, and the module it loads."""

    name: str
    module: str


@dataclass(frozen=True)
class Registry:
    """The connector names `kv_connector` accepts without a `kv_connector_module_path`."""

    connectors: tuple[Connector, ...]
    source: str


@dataclass(frozen=True)
class ConfigField:
    """One `KVTransferConfig` field: its annotation and default as written in the source."""

    name: str
    type: str
    default: str


@dataclass(frozen=True)
class KVTransferConfigFacts:
    """`--kv-transfer-config` fields, and what vLLM does with a key it does not know."""

    fields: tuple[ConfigField, ...]
    unknown_keys: str  # "ignore" (pydantic's default) or "forbid" (the @config decorator's ConfigDict)
    source: str
    # the words of the ValueError a kv_connector without kv_role raises, before the supported roles
    # (0.11.0 names the option kv_disagg_role, later releases kv_role); None: not read
    missing_role: str | None = None


@dataclass(frozen=True)
class EnvVar:
    """A `VLLM_*` environment variable of `envs.environment_variables`, with its default."""

    name: str
    type: str
    default: Scalar


@dataclass(frozen=True)
class Envs:
    """The KV-transfer environment variables (NIXL, Mooncake, KV layout) of the release."""

    vars: tuple[EnvVar, ...]
    source: str


@dataclass(frozen=True)
class SideChannel:
    """NixlConnector's handshake ports: what P advertises (`remote_port`) and what each rank binds."""

    advertised_port: str  # the expression assigned to `self.side_channel_port`
    listener_port: str  # the port expression the handshake listener binds
    dp_stride_is_tp_size: bool  # data-parallel ranks are tensor_parallel_size ports apart
    per_tp_rank: bool  # every TP rank binds its own port (base + tp_rank)
    source: str


@dataclass(frozen=True)
class BufferDevices:
    """`_NIXL_SUPPORTED_DEVICE`: for each platform, the kv_buffer_device values NIXL starts with."""

    by_platform: tuple[tuple[str, tuple[str, ...]], ...]
    source: str


@dataclass(frozen=True)
class ExtraKey:
    """A `kv_connector_extra_config` key a connector reads, with the default it falls back to."""

    name: str
    default: Scalar | tuple[Scalar, ...]


@dataclass(frozen=True)
class ExtraConfig:
    """Every `kv_connector_extra_config` key one connector's sources read."""

    keys: tuple[ExtraKey, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class KVTransferParams:
    """The `kv_transfer_params` protocol: what P's `request_finished` returns and what D reads."""

    produced: tuple[str, ...]  # keys of the dict P returns to the proxy (in source order)
    read: tuple[str, ...]  # keys the connector reads from a request's kv_transfer_params
    finish_statuses: tuple[str, ...]  # RequestStatus values for which P hands blocks over
    block_ids_type: str  # the annotation of remote_block_ids: flat list[int] or one list per group
    source: str


@dataclass(frozen=True)
class MooncakeProtocol:
    """MooncakeConnector's side of the router protocol: the kv_transfer_params keys it reads (the router
    injects them; P returns none) and the HTTP routes of the bootstrap server a prefiller runs."""

    read: tuple[str, ...]
    bootstrap_routes: tuple[tuple[str, str], ...]  # (method, path)
    # the bootstrap server's payload types beside its routes: (class, ((field, annotation), ...))
    bootstrap_schemas: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Handshake:
    """What P and D compare at the NIXL handshake (empty factors: no compatibility check)."""

    connector_version: int | None  # NIXL_CONNECTOR_VERSION
    hash_factors: tuple[str, ...]  # keys of the compatibility-hash factors dict
    min_nixl: str | None  # check_nixl_version(...) at worker start
    source: str
    # zmq.RCVTIMEO on D's handshake query socket (None: D waits for P's answer without a bound, 0.11.0)
    receive_timeout_ms: int | None = None
    # the worker reports blocks it could not load (`get_block_ids_with_load_errors`), so the scheduler
    # recomputes or fails the request; False: a failed handshake or read has no way back (0.11.0)
    reports_load_errors: bool = True


@dataclass(frozen=True)
class Lease:
    """How D keeps P's blocks alive (0.33+): how often D sends heartbeats and how far each one extends
    the lease, as expressions of `kv_lease_duration` (None: the release holds blocks for a fixed time)."""

    heartbeat_interval: str | None  # e.g. "kv_lease_duration // 6"
    extension: str | None  # e.g. "kv_lease_duration * 2 // 3"
    sources: tuple[str, ...]


@dataclass(frozen=True)
class ChunkedPrefill:
    """How `--no-enable-chunked-prefill` is treated for generative models."""

    forced_on: bool  # EngineArgs sets it True whatever the flag said
    disable_warning: str | None  # the warning logged when it is disabled, if any
    source: str


@dataclass(frozen=True)
class PrefixCaching:
    """What `enable_prefix_caching` becomes when the flag is not given (the expression, and when)."""

    default: str  # "True", or what it depends on (0.33: model_config.is_prefix_caching_supported)
    when: str  # the conditions of that default
    source: str
    # PrefixCacheStats keeps a preempted request's lookups apart (preempted_queries/hits, 0.33), out of
    # vllm:prefix_cache_queries/hits; False: every lookup counts (0.11)
    preempted_apart: bool
    stats_source: str


@dataclass(frozen=True)
class BatchTier:
    """Default max_num_batched_tokens / max_num_seqs for `vllm serve` on a GPU of at least min_gib."""

    min_gib: int
    excluded: tuple[str, ...]  # device-name substrings / checks that drop a GPU to a lower tier
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class BatchDefaults:
    """Usage-context OPENAI_API_SERVER defaults by GPU memory, and how max_num_seqs is capped."""

    tiers: tuple[BatchTier, ...]  # largest first; the last is the fallback (min_gib 0)
    max_num_seqs_rule: str  # the expression assigned to self.max_num_seqs when it is defaulted
    source: str
    # `--performance-mode` values that multiply a defaulted max_num_batched_tokens and max_num_seqs before
    # the chunked-prefill floor and the max_num_seqs cap (0.33: throughput doubles both); empty: no such
    # option, or no mode changes them
    mode_factors: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ServeFlag:
    """One `vllm serve` option: its option strings (negative forms included) and the values it takes."""

    names: tuple[str, ...]
    nargs: str  # "0" a switch, "1" one value, "?" an optional value, "+" / "*" a list
    negatives: tuple[str, ...] = ()  # the names that set a switch False (--no-x; 0.33: --disable-x)
    # the kinds of its annotation (`int`, `str`, `Literal`, a config class...; `None` left out)
    types: tuple[str, ...] = ()
    # the Literal's values, sorted as `literal_to_kwargs` passes them: argparse `choices` when `str` is not
    # among the types, else only a metavar (0.33's `CacheDType | str`: the config validator decides)
    choices: tuple[str, ...] = ()

    @property
    def choices_enforced(self) -> bool:
        """Whether argparse itself refuses a value outside `choices` (a Literal without `| str`)."""
        return bool(self.choices) and "str" not in self.types


@dataclass(frozen=True)
class ServeFlagGroup:
    """The options one vLLM file registers on the `vllm serve` parser."""

    flags: tuple[ServeFlag, ...]
    source: str


@dataclass(frozen=True)
class ServeFlags:
    """Every option `vllm serve` accepts, and whether its parser takes unambiguous abbreviations."""

    groups: tuple[ServeFlagGroup, ...]
    allow_abbrev: bool  # argparse's allow_abbrev: FlexibleArgumentParser keeps argparse's True
    source: str  # where the parser class is defined


@dataclass(frozen=True)
class Release:
    """Everything pdfleet knows about one vLLM release, each part with its source file."""

    version: str
    registry: Registry
    kv_transfer_config: KVTransferConfigFacts
    envs: Envs
    side_channel: SideChannel
    buffer_devices: BufferDevices
    nixl_extra_config: ExtraConfig
    mooncake_extra_config: ExtraConfig | None
    mooncake_protocol: MooncakeProtocol | None
    kv_transfer_params: KVTransferParams
    handshake: Handshake
    lease: Lease
    chunked_prefill: ChunkedPrefill
    prefix_caching: PrefixCaching
    batch_defaults: BatchDefaults
    metrics: tuple[Metric, ...]
    serve_flags: ServeFlags
    # every other `vllm:` family the release's sources declare, per file (kinds and labels not tabled)
    other_metrics: tuple[OtherMetrics, ...] = ()
    # the `KV Transfer metrics` log line of NixlConnector and MooncakeConnector, where the release has one
    transfer_logs: tuple[TransferLog, ...] = ()

    def has_connector(self, name: str) -> bool:
        """Whether `kv_connector: name` is registered in this release."""
        return any(c.name == name for c in self.registry.connectors)

    def config_keys(self) -> tuple[str, ...]:
        """The keys --kv-transfer-config accepts (others: see kv_transfer_config.unknown_keys)."""
        return tuple(f.name for f in self.kv_transfer_config.fields)

    def env_default(self, name: str) -> Scalar:
        """The default of a KV-transfer env var; KeyError if the release does not read it."""
        for var in self.envs.vars:
            if var.name == name:
                return var.default
        raise KeyError(f"vLLM {self.version} has no {name}")

    def has_env(self, name: str) -> bool:
        """Whether the release reads this env var."""
        return any(var.name == name for var in self.envs.vars)

    def env_number(self, name: str) -> float:
        """A numeric env var's default (a port, a timeout); TypeError if the table gives it another type."""
        return _number(self.env_default(name), f"vLLM {self.version}: {name}")

    def extra_default(self, connector: str, key: str) -> Scalar | tuple[Scalar, ...]:
        """The default of a connector's kv_connector_extra_config key; KeyError if it reads no such key."""
        extra = self.nixl_extra_config if connector == "NixlConnector" else self.mooncake_extra_config
        for item in extra.keys if extra else ():
            if item.name == key:
                return item.default
        raise KeyError(f"{connector} in vLLM {self.version} reads no kv_connector_extra_config.{key}")

    def side_channel_ports(self, base: int, tensor_parallel_size: int, dp_rank: int = 0) -> tuple[int, ...]:
        """The TCP ports one NixlConnector instance binds for VLLM_NIXL_SIDE_CHANNEL_PORT=base."""
        side = self.side_channel
        first = base + dp_rank * (tensor_parallel_size if side.dp_stride_is_tp_size else 1)
        count = tensor_parallel_size if side.per_tp_rank else 1
        return tuple(range(first, first + count))

    def kv_hold_s(self) -> tuple[str, float]:
        """How long P keeps handed-over KV blocks: ("timeout", s) fixed, or ("lease", s) renewed by D."""
        if self.has_env("VLLM_NIXL_ABORT_REQUEST_TIMEOUT"):
            return "timeout", self.env_number("VLLM_NIXL_ABORT_REQUEST_TIMEOUT")
        return "lease", self._lease_default()

    def _lease_default(self) -> float:
        """NixlConnector's default kv_connector_extra_config.kv_lease_duration (s) in this release."""
        lease = self.extra_default("NixlConnector", "kv_lease_duration")
        return _number(lease, f"vLLM {self.version}: kv_connector_extra_config.kv_lease_duration")

    def lease_timing(self, kv_lease_duration: float | None = None) -> tuple[float, float, float] | None:
        """(lease, heartbeat interval, extension per heartbeat) in seconds for a lease duration (the
        release's default when None); None for a release without leases."""
        lease = self.lease
        if lease.heartbeat_interval is None or lease.extension is None:
            return None
        if kv_lease_duration is None:
            kv_lease_duration = self._lease_default()
        scope = {"kv_lease_duration": kv_lease_duration}
        return kv_lease_duration, _arith(lease.heartbeat_interval, scope), _arith(lease.extension, scope)

    def buffer_devices_on(self, platform: str) -> tuple[str, ...]:
        """kv_buffer_device values NixlConnector accepts on a platform ("cuda", "cpu", ...)."""
        return dict(self.buffer_devices.by_platform).get(platform, ())

    def batch_tier(self, gpu_memory_gib: float, device_name: str = "") -> BatchTier:
        """The default max_num_batched_tokens / max_num_seqs tier for a GPU (see BatchDefaults)."""
        name = device_name.lower()
        for tier in self.batch_defaults.tiers:
            if gpu_memory_gib >= tier.min_gib and not any(x in name for x in tier.excluded):
                return tier
        return self.batch_defaults.tiers[-1]

    def mode_factor(self, performance_mode: str | None) -> int:
        """What `--performance-mode` multiplies defaulted batch limits by (1: not scaled, or unset)."""
        return dict(self.batch_defaults.mode_factors).get(performance_mode or "", 1)

    def metric(self, name: str) -> Metric:
        """A metric by its registered name (`vllm:...`, counters without `_total`); KeyError if absent."""
        for metric in self.metrics:
            if metric.name == name:
                return metric
        raise KeyError(f"vLLM {self.version} registers no metric {name}")

    def transfer_log(self, connector: str) -> TransferLog | None:
        """The keys of a connector's `KV Transfer metrics` line in this release (None: it logs none)."""
        return next((log for log in self.transfer_logs if log.connector == connector), None)

    def serve_flag(self, name: str) -> ServeFlag | None:
        """The `vllm serve` option one of whose option strings is `name` (None: the release has none)."""
        for group in self.serve_flags.groups:
            for flag in group.flags:
                if name in flag.names:
                    return flag
        return None

    def metric_names(self, include_conditional: bool = False) -> tuple[str, ...]:
        """Names registered on every start (and, if asked, those behind a condition too)."""
        return tuple(m.name for m in self.metrics if include_conditional or m.when is None)


_ARITH = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
}


def _arith(text: str, scope: dict[str, float]) -> float:
    """An expression of the table (`kv_lease_duration * 2 // 3`): numbers, names in scope, + - * / //."""

    def value(node: ast.expr) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name) and node.id in scope:
            return scope[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return _ARITH[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not a table expression: {text!r}")

    return float(value(ast.parse(text, mode="eval").body))


def version_key(version: str) -> tuple[int, ...]:
    """`0.11.0` as (0, 11, 0), for ordering releases."""
    return tuple(int(part) for part in version.split("."))


def find_release(version: str, table: dict[str, Release]) -> Release | None:
    """The facts for a pin: the exact tabled release, else None. Never a neighbour: a patch release can
    change what pdfleet renders and checks (0.11.2 honours chunked prefill off, binds one side-channel
    port where 0.11.0 binds one per TP rank), so an untabled pin is refused, not guessed."""
    return table.get(version)


def _number(value: object, what: str) -> float:
    """A table default that must be a number; anything else is a bug in the generated table, said so."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} defaults to {value!r} in the release table, not a number")
    return value
