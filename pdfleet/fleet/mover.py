"""The rebalance mover, pure: a layout (which pool each host serves) and one move asked (a host, a target
pool) in; out, the ordered steps that move the host without dropping a stream, or a refusal with its reason.

A bare-metal fleet has a fixed number of GPUs; what it can change is which pool each host serves (issue 35).
Moving a host means: stop sending it new requests (drain), let the streams it has finish (a bounded wait),
re-render its units for the new role, wait for its health, and only then put it into the new pool's
routing. Nothing here does I/O: `invoke rebalance` executes the steps, as the rollout controller executes
pdfleet.rollout.machine's transitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pdfleet.model.inventory import Inventory
from pdfleet.model.served import ServedModel, runs_on
from pdfleet.model.specs import POOL_NAMES

StepKind = Literal["drain", "wait", "render", "health", "admit"]
DEFAULT_WAIT_S = 120.0  # how long a drained host's streams may run before the move goes on without them
ROUTED_POOLS = ("prefill", "decode")  # the pools vllm-router selects from (the gateway routes colocated)
# a vLLM instance's requests still in it: in execution batches, and queued for them
IN_FLIGHT_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# the fraction of its KV blocks in use: a prefill instance keeps a finished request's blocks (vLLM's delayed
# free, the simulator's hold) until the decode instance that reads them says it has, so above 0 with no
# request running, a decode still reads them
KV_USAGE_SERIES = "vllm:kv_cache_usage_perc"


@dataclass(frozen=True)
class Layout:
    """Which pools each host serves (in inventory order), what each pool's host needs, and how few hosts
    each pool may keep. A host serving two pools (same-host P/D) is in the layout but cannot be moved."""

    hosts: Mapping[str, tuple[str, ...]]  # host -> its pools, in prefill, decode, colocated order
    host_gpus: Mapping[str, tuple[int, ...]]  # host -> the GPU indices the inventory declares
    pool_gpus: Mapping[str, tuple[int, ...]]  # pool the profile sets -> the GPU indices it runs on
    minimums: Mapping[str, int] = field(default_factory=dict)  # pool -> fewest hosts (unset: 1)

    def members(self, pool: str) -> list[str]:
        """The hosts serving a pool, in inventory order."""
        return [host for host, pools in self.hosts.items() if pool in pools]

    def minimum(self, pool: str) -> int:
        """The fewest hosts a pool may keep: its own minimum, else 1 (a pool is never emptied)."""
        return self.minimums.get(pool, 1)

    def with_move(self, host: str, to: str) -> Layout:
        """The layout after `host` serves `to` only."""
        hosts = {name: ((to,) if name == host else pools) for name, pools in self.hosts.items()}
        return Layout(hosts, self.host_gpus, self.pool_gpus, self.minimums)

    def drained(self, host: str) -> Layout:
        """The layout while `host` is drained: it serves no pool, so nothing routes new requests to it."""
        hosts = {name: (() if name == host else pools) for name, pools in self.hosts.items()}
        return Layout(hosts, self.host_gpus, self.pool_gpus, self.minimums)


@dataclass(frozen=True)
class Step:
    """One thing the executor does, with the pool it concerns and, for `wait`, its bound in seconds."""

    kind: StepKind
    host: str
    pool: str
    detail: str
    bound_s: float | None = None


@dataclass(frozen=True)
class MovePlan:
    """A move the mover accepts: its steps in order and the layout once they are done."""

    host: str
    source: str
    target: str
    steps: tuple[Step, ...]
    after: Layout


@dataclass(frozen=True)
class Refusal:
    """A move the mover refuses, and why (what, and what to do instead)."""

    host: str
    target: str
    reason: str


def layout_of(spec: ServedModel, inventory: Inventory, minimums: Mapping[str, int] | None = None) -> Layout:
    """A model's layout as the profile and the inventory give it (hosts without its pools left out), with
    the profile's per-pool minimums (rollout.rebalance.minimums) unless `minimums` is given."""
    hosts = {
        name: tuple(pools)
        for name, host in inventory.hosts.items()
        if (pools := runs_on(inventory, spec, host))
    }
    return Layout(
        hosts,
        {name: host.gpus for name, host in inventory.hosts.items()},
        {pool: tuple(pool_spec.gpus) for pool, pool_spec in spec.pools.items()},
        {
            str(pool): n
            for pool, n in (spec.rollout.rebalance.minimums if minimums is None else minimums).items()
        },
    )


def plan_move(layout: Layout, host: str, to: str, wait_s: float = DEFAULT_WAIT_S) -> MovePlan | Refusal:
    """The steps that move `host` into pool `to`, or the first reason the move is refused."""
    why = _refusal(layout, host, to)
    if why is not None:
        return Refusal(host, to, why)
    (source,) = layout.hosts[host]
    steps = (
        Step("drain", host, source, f"stop routing new requests to {host} in the {source} pool"),
        Step("wait", host, source, f"wait for {host}'s in-flight requests", bound_s=wait_s),
        Step("render", host, to, f"render and apply {host}'s units for the {to} role"),
        Step("health", host, to, f"wait until {host}'s {to} instance answers /health"),
        Step("admit", host, to, f"route the {to} pool's requests to {host} and scrape it as {to}"),
    )
    return MovePlan(host, source, to, steps, layout.with_move(host, to))


def _refusal(layout: Layout, host: str, to: str) -> str | None:
    """Why a move is refused (None: it is not), checked in the order an operator would fix them."""
    if to not in POOL_NAMES:
        return f"unknown pool {to!r}; pools: {', '.join(POOL_NAMES)}"
    if host not in layout.hosts:
        known = ", ".join(layout.hosts) or "(none)"
        return f"host {host!r} serves no pool of this model; hosts that do: {known}"
    pools = layout.hosts[host]
    if len(pools) > 1:
        return (
            f"host {host} serves {' and '.join(pools)} at once (same-host P/D); "
            "only a host serving one pool can move"
        )
    (source,) = pools
    if source == to:
        return f"host {host} already serves the {to} pool"
    if to not in layout.pool_gpus:
        return f"the profile sets no {to} pool (pools.{to}): there is no role to move {host} into"
    return _fit(layout, host, to) or _keeps_minimum(layout, host, source)


def _fit(layout: Layout, host: str, to: str) -> str | None:
    """A host fits a role when it has every GPU index the role's pool runs on."""
    have = layout.host_gpus.get(host, ())
    missing = [gpu for gpu in layout.pool_gpus[to] if gpu not in have]
    if not missing:
        return None
    return (
        f"host {host} has no GPU {', '.join(map(str, missing))} that pools.{to}.gpus "
        f"{list(layout.pool_gpus[to])} needs (it declares gpus {list(have)})"
    )


def _keeps_minimum(layout: Layout, host: str, source: str) -> str | None:
    """Moving a host out may not leave its pool below the pool's minimum (never empty)."""
    left = len(layout.members(source)) - 1
    need = layout.minimum(source)
    if left >= need:
        return None
    if left == 0:
        return f"host {host} is the last host of the {source} pool; add one to it first"
    return f"the {source} pool would keep {left} host(s), below its minimum of {need}"


def drains_through_router(pool: str) -> bool:
    """Whether a host leaving `pool` is drained by vllm-router's own /remove_worker (the P/D pools: the
    pinned 0.1.17 removes a P/D worker live, keeping its streams), else by a gateway policy reload."""
    return pool in ROUTED_POOLS


def in_flight(metrics: Mapping[str, float]) -> int | None:
    """The requests still in a vLLM instance, from its /metrics (None: it exports neither series)."""
    found = [metrics[name] for name in IN_FLIGHT_SERIES if name in metrics]
    return round(sum(found)) if found else None


@dataclass(frozen=True)
class Left:
    """What a drained instance still holds: its requests, and (a prefill instance) whether KV blocks a
    decode instance may still read are held."""

    requests: int
    kv_held: bool = False

    @property
    def done(self) -> bool:
        """Nothing left: the instance's unit can be retired without cutting a stream or a KV read."""
        return self.requests == 0 and not self.kv_held


def left_in(pool: str, metrics: Mapping[str, float]) -> Left | None:
    """What a drained `pool` instance still holds, from its /metrics (None: it exports neither request
    series). A prefill instance with no request left still holds KV for a decode's read while its KV usage
    is above 0 (running 0 is not enough); a prefill instance that exports no KV usage counts as holding."""
    requests = in_flight(metrics)
    if requests is None:
        return None
    held = pool == "prefill" and metrics.get(KV_USAGE_SERIES, 1.0) > 0
    return Left(requests, held)


def keeps_live_layout(after: Layout, initial: Layout) -> bool:
    """Whether the layout after a move must be kept as the live layout: not when it is the inventory's
    (`initial`) again, where the state file goes and every task reads the inventory as before."""
    return dict(after.hosts) != dict(initial.hosts)
