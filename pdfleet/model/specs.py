"""The per-model building blocks of a profile: the model, its pools, KV transfer, router policy and SLOs.

Strict, immutable pydantic models (unknown keys are errors). A profile's top level and each entry of its
`models:` list are made of these (pdfleet.model.served); the rest of the schema is pdfleet.model.profile.
"""

from __future__ import annotations

import difflib
import posixpath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from pdfleet.model.connectors import MOONCAKE, NIXL, NIXL_SIDE_CHANNEL_PORT

POOL_NAMES = ("prefill", "decode", "colocated")
DEFAULT_KV_ROLES: dict[str, str | None] = {
    "prefill": "kv_producer",
    "decode": "kv_consumer",
    "colocated": None,
}

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


class StrictModel(BaseModel):
    """Strict, immutable, no unknown keys: a typo in a profile is an error, never silently ignored."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


HUB = "hub"
# An environment variable's name, as a shell and systemd read it.
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


def _weights_source(value: str) -> str:
    """`hub`, an http(s) mirror directory, or an absolute path on the control machine: anything else would
    be read as one of them by accident (a relative path against whatever directory invoke ran in)."""
    if value == HUB or value.startswith(("http://", "https://")):
        return value
    if value.startswith("/") and posixpath.normpath(value) == value.rstrip("/"):
        return value
    raise ValueError(
        "must be 'hub', an http:// or https:// mirror directory, or an absolute path on the control "
        f"machine like /srv/models (got {value!r})"
    )


class TokenSource(StrictModel):
    """Where the control machine reads the hub token: a file (mode 0600) or an environment variable, never
    the token itself (a profile is committed and printed)."""

    file: str | None = Field(default=None, min_length=1)
    env: str | None = Field(default=None, pattern=ENV_NAME)

    @model_validator(mode="after")
    def _exactly_one(self) -> TokenSource:
        if (self.file is None) == (self.env is None):
            raise ValueError(
                "set exactly one of file (a path on the control machine) or env (a variable name)"
            )
        return self


class ModelSpec(StrictModel):
    """The model served: Hugging Face id, optional local path and tokenizer, and where its weights come
    from (`source`: unset, vLLM fetches them itself by id; else provision stages them, see roles/weights)."""

    id: str = Field(min_length=1)
    path: str | None = None
    tokenizer: str | None = None
    served_model_name: str | None = None
    max_model_len: Positive | None = None
    # the hub's commit hash (or a branch/tag vLLM resolves itself), or a site mirror's version id
    revision: str | None = Field(default=None, min_length=1)
    # hub: the hub's HTTP API; http(s)://...: a mirror directory holding <id>/<revision>/manifest.json and
    # the files; /abs/path: the same layout on the control machine, pushed to the hosts
    source: Annotated[str, AfterValidator(_weights_source)] | None = None
    token: TokenSource | None = None  # the hub token's file or variable on the control machine
    hub_endpoint: str | None = None  # source hub: the hub's URL (unset: https://huggingface.co)
    # per host and file, curl's --limit-rate (bytes per second, K/M/G suffixes)
    bandwidth_limit: str | None = Field(default=None, pattern=r"^[1-9][0-9]*[KMG]?$")

    @property
    def staged(self) -> bool:
        """True when provision stages the weights (a source is set) and vLLM loads them offline."""
        return self.source is not None


class KVTransferSpec(StrictModel):
    """KV transfer between prefill and decode: the vLLM connector and its transport settings."""

    connector: str = NIXL
    buffer_device: Literal["cuda", "cpu"] = "cuda"
    side_channel_host: str = "auto"  # auto: each host's inventory address (ansible_host)
    side_channel_port: Port = NIXL_SIDE_CHANNEL_PORT
    mooncake_bootstrap_port: Port = 8998
    mooncake_protocol: Literal["rdma", "tcp"] = "rdma"
    ucx_tls: str | None = None
    # UCX's TCP data ports (UCX_TCP_PORT_RANGE, "first-last"): pinned so a firewall can open them and
    # `verify --kv-path` can name them; unset, UCX binds an ephemeral port
    ucx_tcp_port_range: str | None = Field(default=None, pattern=r"^[1-9][0-9]{0,4}-[1-9][0-9]{0,4}$")
    # the side-channel port `verify --kv-path`'s probe listens on, on prefill hosts, while it runs
    probe_port: Port = 5599
    # engine: sim only: install the connector's CPU build (NIXL: nixl-cu12 without its torch dependency,
    # Mooncake: mooncake-transfer-engine-non-cuda) so `verify --kv-path` moves real bytes in the lab
    sim_library: bool = False
    # with sim_library, the simulator moves this fraction of each P/D request's KV bytes through the library
    # (the model's per-token KV bytes x prompt tokens x this, per block; kv-transfer.env carries it):
    # 0.001 moves ~3 MB for a 9K-token prompt of a 70B model, ~12 ms over the lab's TCP bridge
    sim_bytes_fraction: float = Field(default=0.001, gt=0, le=1)
    load_failure_policy: Literal["recompute", "fail"] | None = None
    extra_config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _port_range_ordered(self) -> KVTransferSpec:
        if self.ucx_tcp_port_range:
            first, last = (int(x) for x in self.ucx_tcp_port_range.split("-"))
            if not first <= last <= 65535:
                raise ValueError(
                    f"kv_transfer.ucx_tcp_port_range {self.ucx_tcp_port_range!r}: want first-last, "
                    "first <= last <= 65535"
                )
        return self

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


class PoolSpec(StrictModel):
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
    # inventory host or group names the pool runs on (unset: the inventory group named after the pool)
    hosts: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1)


class Pools(StrictModel):
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


class RouterPolicy(StrictModel):
    """vllm-router's worker selection in P/D mode, per pool (its --prefill-policy and --decode-policy)."""

    prefill: Annotated[str, BeforeValidator(_router_policy_name)] = DEFAULT_ROUTER_POLICY
    decode: Annotated[str, BeforeValidator(_router_policy_name)] = DEFAULT_ROUTER_POLICY

    def argv(self) -> list[str]:
        """vllm-router's selection flags: one --policy when both pools share it, else one per pool. The one
        rendering of a policy: the provisioned unit and the loopback router (`bench.launch`) both use it,
        so no router runs the router's own default (cache_aware) while the profile says otherwise."""
        if self.prefill == self.decode:
            return ["--policy", self.prefill]
        return ["--prefill-policy", self.prefill, "--decode-policy", self.decode]


def one_or_per_pool(value: Any) -> Any:
    """`router_policy: NAME` sets both pools; `{prefill: NAME, decode: NAME}` each (unset: the default)."""
    if isinstance(value, str):
        name = _router_policy_name(value)
        return {"prefill": name, "decode": name}
    if isinstance(value, dict | RouterPolicy):
        return value
    raise ValueError(f"must be a policy name (both pools) or {{prefill: NAME, decode: NAME}} (got {value!r})")


class SloSpec(StrictModel):
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
