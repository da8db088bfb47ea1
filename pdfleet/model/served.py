"""The models a profile serves (issue 24): one immutable spec per model, whatever the profile's form.

A profile either has the single-model keys at its top level (one model, named after its gateway alias or
its id) or a `models:` list whose entries may override any per-model key and inherit the rest from the top
level, merged as `extends:` merges (mappings key by key, lists and scalars whole, `key: null` clears).
Readers of model things (pools, KV transfer, stages, SLOs, rollout plans, the router) read these specs.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PrivateAttr

from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.routing import MODEL_DECIDER_KEYS, ModelDecider
from pdfleet.model.specs import (
    KVTransferSpec,
    ModelSpec,
    Pools,
    Port,
    Positive,
    RouterPolicy,
    SloSpec,
    StrictModel,
    one_or_per_pool,
)
from pdfleet.model.stages import StageSpec
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release

# vLLM's KV-events publisher (KVEventsConfig.endpoint's default port); a model's colocated instances publish
# at this port plus the model's place in `models:` (two models may share a host), its P/D pool's prefill
# instances at a base of their own (a same-host layout runs a prefill and a colocated instance on one host)
KV_EVENTS_PORT = 5557
PREFILL_KV_EVENTS_PORT = 5657
# vLLM's replay socket beside each publisher (KVEventsConfig.replay_endpoint): the gateway asks it for the
# batches it missed (a sequence gap) before it forgets the instance's blocks
KV_EVENTS_REPLAY_PORT = 5757
PREFILL_KV_EVENTS_REPLAY_PORT = 5857

# The per-model keys: a `models:` entry inherits each from the top level unless it sets it.
MODEL_KEYS = ("model", "topology", "pools", "kv_transfer", "slo", "rollout")
GATEWAY_KEYS = (
    "long_prompt_tokens",
    "stage",
    "stages",
    "router_port",
    "router_prometheus_port",
    "router_policy",
)
# A model's name is in `--model`, unit names and the Prometheus `model` label: a short slug.
NAME_PATTERN = r"^[a-z][a-z0-9-]{0,30}$"
Topology = Literal["same-host", "cross-host", "colocated"]
DEFAULT_ROUTER_PORT = 8090
DEFAULT_ROUTER_METRICS_PORT = 29000


class ModelLimits(StrictModel):
    """A model's own gateway limit: the longest prompt its aliases take (unset: no cap)."""

    model_max_prompt_tokens: Positive | None = None


class ModelGateway(StrictModel):
    """The gateway's per-model settings: long-prompt threshold, stages, and the model's P/D router."""

    long_prompt_tokens: Positive = 8192
    stage: str
    stages: dict[str, StageSpec] = Field(min_length=1)
    router_port: Port = DEFAULT_ROUTER_PORT
    router_prometheus_port: Port = DEFAULT_ROUTER_METRICS_PORT
    router_policy: Annotated[RouterPolicy, BeforeValidator(one_or_per_pool)] = Field(
        default_factory=RouterPolicy
    )
    limits: ModelLimits = Field(default_factory=ModelLimits)
    decider: ModelDecider = Field(default_factory=ModelDecider)  # the model's cache-facts source


class ServedModel(StrictModel):
    """One model the fleet serves: its id, the aliases clients name it by, its pools and its own stages,
    rollout plans, gates and SLOs."""

    name: str = Field(pattern=NAME_PATTERN)
    model: ModelSpec
    aliases: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    topology: Topology
    pools: Pools = Field(default_factory=Pools)
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec)
    slo: SloSpec
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    gateway: ModelGateway
    _index: int | None = PrivateAttr(default=None)  # its place in `models:` (None: the top level)

    def key(self, path: str) -> str:
        """A key path of this model as the profile spells it: `models[1].pools.colocated.port` in a list."""
        return path if self._index is None else f"models[{self._index}].{path}"

    @property
    def index(self) -> int | None:
        """Its place in `models:` (None: a single-model profile)."""
        return self._index

    @property
    def listed(self) -> bool:
        """True for an entry of `models:` (unit names carry its name), False for a single-model profile."""
        return self._index is not None

    @property
    def disaggregated(self) -> bool:
        """True for same-host and cross-host (prefill/decode pools joined by a KV connector)."""
        return self.topology != "colocated"

    @property
    def has_router(self) -> bool:
        """A P/D router runs for it: both prefill and decode pools are set."""
        return self.pools.prefill is not None and self.pools.decode is not None

    def served_model_names(self) -> list[str]:
        """The names its pools answer to: the model's own, then its aliases, so the gateway passes request
        bodies through untouched instead of rewriting `model`."""
        names = [self.model.served_model_name or self.model.id]
        return names + [alias for alias in self.aliases if alias not in names]

    def side_channel_port_for(self, pool: str, vllm_version: str) -> int | None:
        """See KVTransferSpec.side_channel_port_for; None for every pool of a colocated model.

        vLLM 0.11 binds one port per TP rank (base .. base+tp-1), so the decode instance starts past
        the prefill instance's last port: a same-host pair with TP >= 2 would collide on base+1.
        """
        if not self.disaggregated:
            return None
        port = self.kv_transfer.side_channel_port_for(pool)
        rel = find_release(vllm_version, RELEASES)
        prefill = self.pools.prefill
        if pool == "decode" and port is not None and rel is not None and prefill is not None:
            base = self.kv_transfer.side_channel_port
            return base + len(rel.side_channel_ports(base, prefill.tensor_parallel_size))
        return port

    def bootstrap_port_for(self, pool: str) -> int | None:
        """MooncakeConnector's bootstrap port of a pool's instance (None: none, or a colocated model)."""
        return self.kv_transfer.bootstrap_port_for(pool) if self.disaggregated else None

    def kv_events_port_for(self, pool: str) -> int | None:
        """The KV-events publisher's port of a pool's instance: when the model's decider reads its cache
        facts from KV events (gateway.decider.cache_source: kv_events), its colocated instances publish,
        and its P/D pool's prefill instances (the P/D candidate's cache facts)."""
        if self.gateway.decider.cache_source != "kv_events":
            return None
        if pool == "colocated":
            return KV_EVENTS_PORT + (self.index or 0)
        if pool == "prefill" and self.has_router:
            return PREFILL_KV_EVENTS_PORT + (self.index or 0)
        return None

    def kv_events_replay_port_for(self, pool: str) -> int | None:
        """The replay socket's port beside a pool instance's KV-events publisher (None: it publishes none)."""
        if self.kv_events_port_for(pool) is None:
            return None
        base = KV_EVENTS_REPLAY_PORT if pool == "colocated" else PREFILL_KV_EVENTS_REPLAY_PORT
        return base + (self.index or 0)


def slug(text: str) -> str:
    """A model name from an alias or id: `llama-3.1-8b` -> `llama-3-1-8b` (NAME_PATTERN)."""
    name = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"m-{name}"
    return name[:31].rstrip("-")


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key (override wins); anything else is replaced whole (`extends:`'s rule)."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def inherited(top: dict[str, Any]) -> dict[str, Any]:
    """What every `models:` entry inherits from a profile's raw top level: its per-model keys."""
    found = {key: top[key] for key in MODEL_KEYS if key in top}
    gateway = top.get("gateway")
    if isinstance(gateway, dict):
        found["gateway"] = {key: gateway[key] for key in GATEWAY_KEYS if key in gateway}
        limits = gateway.get("limits")
        if isinstance(limits, dict) and "model_max_prompt_tokens" in limits:
            found["gateway"]["limits"] = {"model_max_prompt_tokens": limits["model_max_prompt_tokens"]}
        decider = gateway.get("decider")
        if isinstance(decider, dict):
            own = {key: decider[key] for key in MODEL_DECIDER_KEYS if key in decider}
            if own:
                found["gateway"]["decider"] = own
    return found


def expand_models(data: dict[str, Any]) -> dict[str, Any]:
    """A raw profile with each `models:` entry merged over what it inherits, and the top level's required
    per-model keys (model, topology, slo, gateway.stage/stages) taken from the first entry where unset."""
    entries = data.get("models")
    if not isinstance(entries, list) or not entries:
        return data
    base = inherited(data)
    merged = [merge(base, entry) if isinstance(entry, dict) else entry for entry in entries]
    out = {**data, "models": merged}
    first = merged[0] if isinstance(merged[0], dict) else {}
    for key in ("model", "topology", "slo"):
        if key not in out and key in first:
            out[key] = first[key]
    gateway = out.get("gateway")
    first_gateway = first.get("gateway")
    if isinstance(gateway, dict) and isinstance(first_gateway, dict):
        out["gateway"] = {
            **{k: first_gateway[k] for k in ("stage", "stages") if k in first_gateway},
            **gateway,
        }
    return out


def pool_hosts(inventory: Inventory, spec: ServedModel, pool: str) -> list[Host]:
    """The hosts a model's pool runs on, in inventory order: the hosts and groups its `hosts:` names, else
    the inventory group named after the pool (unknown names are inventory_checks' to report)."""
    names = spec.pools.get(pool).hosts
    if names is None:
        return inventory.group(pool)
    wanted = {
        n for name in names for n in ([name] if name in inventory.hosts else inventory.groups.get(name, ()))
    }
    return [host for name, host in inventory.hosts.items() if name in wanted]


def runs_on(inventory: Inventory, spec: ServedModel, host: Host) -> list[str]:
    """The pools of a model a host runs, in prefill, decode, colocated order."""
    return [
        pool
        for pool, _ in spec.pools.items()
        if any(h.name == host.name for h in pool_hosts(inventory, spec, pool))
    ]
