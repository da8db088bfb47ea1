"""Checks of a profile against an inventory, for each model it serves: the hosts its pools name or the
groups its topology needs, GPU indices the hosts declare, reachable addresses, RDMA devices, and ports or
GPUs one host would use twice (across models too)."""

from __future__ import annotations

from collections.abc import Iterable

from pdfleet.model.checks import is_loopback
from pdfleet.model.host_checks import HostRuns, host_problems
from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.problems import Problem, problems_error
from pdfleet.model.profile import PoolSpec, Profile
from pdfleet.model.served import ServedModel, pool_hosts, runs_on

MONITORING_GROUP = "monitoring"  # its hosts run Prometheus on monitoring.port (fleet.topology's group)


def check_against_inventory(profile: Profile, inventory: Inventory) -> None:
    """Semantic checks needing hosts (ports, GPUs, groups, RDMA devices); one error listing all problems."""
    problems = inventory_problems(profile, inventory)
    if problems:
        raise problems_error(profile, problems)


def inventory_problems(profile: Profile, inventory: Inventory) -> list[Problem]:
    """Problems of this profile on these hosts: groups, GPU indices, RDMA devices, port/GPU clashes."""
    problems: list[Problem] = []
    for spec in profile.served:
        unknown = list(_unknown_host_problems(spec, inventory))
        problems += unknown
        if unknown:
            continue  # where its pools run is not known: the rest would only guess
        problems += _group_problems(spec, inventory)
        problems += _gateway_problems(spec, inventory)
        for pool, pool_spec in spec.pools.items():
            for host in pool_hosts(inventory, spec, pool):
                problems += _host_gpu_problems(spec, pool, pool_spec, host, inventory)
        problems += _address_problems(spec, inventory)
        problems += _rdma_host_problems(profile, spec, inventory)
    monitoring = {h.name for h in inventory.group(MONITORING_GROUP)}
    for host in inventory.hosts.values():
        runs = HostRuns(
            [(spec, pool) for spec in profile.served for pool in runs_on(inventory, spec, host)],
            gateway=host.in_group("gateway"),
            monitoring=host.name in monitoring,
        )
        problems += host_problems(profile, runs, where=host)
    return _dedupe(problems)


def _unknown_host_problems(spec: ServedModel, inventory: Inventory) -> Iterable[Problem]:
    """Every `hosts:` entry must name a host or a group of the inventory."""
    for pool, pool_spec in spec.pools.items():
        for index, name in enumerate(pool_spec.hosts or ()):
            if name not in inventory.hosts and name not in inventory.groups and name != "all":
                yield Problem(
                    spec.key(f"pools.{pool}.hosts[{index}]"),
                    f"{name!r} names no host or group of {inventory.source}; "
                    f"hosts: {', '.join(inventory.hosts) or '(none)'}; "
                    f"groups: {', '.join(inventory.groups) or '(none)'}",
                )


def _members(spec: ServedModel, pool: str, inventory: Inventory) -> list[str]:
    """Names of the hosts a model's pool runs on."""
    return [h.name for h in pool_hosts(inventory, spec, pool)]


def _needs(spec: ServedModel, pool: str) -> str:
    """Where a pool's hosts come from, for messages: its `hosts:` or the group named after it."""
    pool_spec = getattr(spec.pools, pool)
    if pool_spec is not None and pool_spec.hosts is not None:
        return f"hosts in {spec.key(f'pools.{pool}.hosts')} ({', '.join(pool_spec.hosts)})"
    return f"hosts in group {pool}"


def _group_problems(spec: ServedModel, inventory: Inventory) -> Iterable[Problem]:
    """The hosts the topology needs: colocated; prefill+decode on shared or distinct hosts."""
    src = inventory.source
    groups = ", ".join(inventory.groups) or "(none)"
    if spec.topology == "colocated":
        if not _members(spec, "colocated", inventory):
            need = _needs(spec, "colocated")
            yield Problem(spec.key("topology"), f"colocated needs {need}; {src} has groups: {groups}")
        return
    if spec.pools.colocated is not None and not _members(spec, "colocated", inventory):
        yield Problem(
            spec.key("pools.colocated"),
            f"the colocated baseline pool needs {_needs(spec, 'colocated')}; {src} has groups: {groups}",
        )
    prefill, decode = _members(spec, "prefill", inventory), _members(spec, "decode", inventory)
    for pool, members in (("prefill", prefill), ("decode", decode)):
        if not members:
            need = _needs(spec, pool)
            yield Problem(spec.key("topology"), f"{spec.topology} needs {need}; {src} has groups: {groups}")
    if not prefill or not decode:
        return
    both = [h for h in prefill if h in decode]
    if spec.topology == "same-host":
        if not both:
            yield Problem(
                spec.key("topology"),
                f"same-host needs a host in both groups prefill and decode; in {src} prefill is "
                f"{', '.join(prefill)} and decode is {', '.join(decode)}",
            )
        alone = [h for h in [*prefill, *decode] if h not in both]
        if both and alone:
            yield Problem(
                spec.key("topology"),
                f"same-host runs prefill and decode on the same hosts; {', '.join(dict.fromkeys(alone))} "
                f"in {src} is in only one of the groups prefill/decode",
            )
    elif both:
        yield Problem(
            spec.key("topology"),
            f"cross-host needs distinct prefill and decode hosts; {', '.join(both)} in {src} is in both "
            "(use a same-host profile for that)",
        )


def _gateway_problems(spec: ServedModel, inventory: Inventory) -> Iterable[Problem]:
    """A gateway host needs a colocated pool to route to: without one it would silently get nothing."""
    if spec.pools.colocated is not None:
        return
    for host in inventory.group("gateway"):
        yield Problem(
            spec.key("pools.colocated"),
            f"host {host.name} is in group gateway of {inventory.source}, but without a colocated pool it "
            "would get no gateway (the gateway routes between the colocated and the P/D pool); add "
            f"pools.colocated with hosts in group colocated, or take {host.name} out of group gateway",
        )


def _host_gpu_problems(
    spec: ServedModel, pool: str, pool_spec: PoolSpec, host: Host, inventory: Inventory
) -> Iterable[Problem]:
    """The pool's GPU indices must exist on every host of the pool (inventory var `gpus`)."""
    where = spec.key(f"pools.{pool}.gpus")
    if not host.gpus:
        yield Problem(
            where,
            f"host {host.name} declares no gpus in {inventory.source} (inventory var gpus, e.g. [0, 1])",
        )
        return
    missing = [gpu for gpu in pool_spec.gpus if gpu not in host.gpus]
    if missing:
        yield Problem(
            where,
            f"GPU {', '.join(map(str, missing))} is not on host {host.name} "
            f"({inventory.source} declares gpus {list(host.gpus)})",
        )


def _pd_hosts(spec: ServedModel, inventory: Inventory) -> list[Host]:
    """A model's prefill and decode hosts, each once, prefill first."""
    hosts = [*pool_hosts(inventory, spec, "prefill"), *pool_hosts(inventory, spec, "decode")]
    return list({h.name: h for h in hosts}.values())


def _address_problems(spec: ServedModel, inventory: Inventory) -> Iterable[Problem]:
    """Cross-host KV transfer needs each P/D host's address to be reachable from the others."""
    if spec.topology != "cross-host" or spec.kv_transfer.side_channel_host != "auto":
        return
    for host in _pd_hosts(spec, inventory):
        if is_loopback(host.address):
            yield Problem(
                spec.key("kv_transfer.side_channel_host"),
                f"auto uses host {host.name}'s address {host.address!r}, which other hosts cannot reach; "
                f"set ansible_host in {inventory.source}",
            )


def _rdma_host_problems(profile: Profile, spec: ServedModel, inventory: Inventory) -> Iterable[Problem]:
    """With RDMA on, every prefill/decode host must declare its RDMA devices and netdev."""
    if not profile.rdma.enabled or not spec.disaggregated:
        return
    for host in _pd_hosts(spec, inventory):
        if not host.rdma_devices:
            yield Problem(
                "rdma.enabled",
                f"host {host.name} declares no rdma_devices in {inventory.source} (e.g. [mlx5_0])",
            )
        if not host.rdma_netdev:
            yield Problem(
                "rdma.enabled",
                f"host {host.name} declares no rdma_netdev in {inventory.source} "
                "(the RoCE interface, e.g. ens1f0np0)",
            )


def _dedupe(problems: list[Problem]) -> list[Problem]:
    """Drop repeats (the same clash found from two hosts' points of view), keeping order."""
    return list(dict.fromkeys(problems))
