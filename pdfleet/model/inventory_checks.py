"""Checks of a profile against an inventory: the groups a topology needs, GPU indices the hosts declare,
reachable addresses, RDMA devices, and ports or GPUs one host would use twice."""

from __future__ import annotations

from collections.abc import Iterable

from pdfleet.model.checks import Problem, is_loopback, problems_error, shared_host_problems
from pdfleet.model.inventory import Host, Inventory
from pdfleet.model.profile import PoolSpec, Profile


def check_against_inventory(profile: Profile, inventory: Inventory) -> None:
    """Semantic checks needing hosts (ports, GPUs, groups, RDMA devices); one error listing all problems."""
    problems = inventory_problems(profile, inventory)
    if problems:
        raise problems_error(profile, problems)


def inventory_problems(profile: Profile, inventory: Inventory) -> list[Problem]:
    """Problems of this profile on these hosts: groups, GPU indices, RDMA devices, port/GPU clashes."""
    problems = list(_group_problems(profile, inventory))
    problems += _gateway_problems(profile, inventory)
    for pool, spec in profile.pools.items():
        for host in inventory.group(pool):
            problems += _host_gpu_problems(pool, spec, host, inventory)
    problems += _address_problems(profile, inventory)
    problems += _rdma_host_problems(profile, inventory)
    for host in inventory.hosts.values():
        pools = [pool for pool, _ in profile.pools.items() if host.in_group(pool)]
        problems += shared_host_problems(profile, pools, gateway=host.in_group("gateway"), where=host)
    return _dedupe(problems)


def _group_problems(profile: Profile, inventory: Inventory) -> Iterable[Problem]:
    """The inventory groups the topology needs: colocated; prefill+decode on shared or distinct hosts."""
    src = inventory.source
    groups = ", ".join(inventory.groups) or "(none)"
    if profile.topology == "colocated":
        if not inventory.group("colocated"):
            yield Problem("topology", f"colocated needs hosts in group colocated; {src} has groups: {groups}")
        return
    if profile.pools.colocated is not None and not inventory.group("colocated"):
        yield Problem(
            "pools.colocated",
            f"the colocated baseline pool needs hosts in group colocated; {src} has groups: {groups}",
        )
    prefill = [h.name for h in inventory.group("prefill")]
    decode = [h.name for h in inventory.group("decode")]
    for pool, members in (("prefill", prefill), ("decode", decode)):
        if not members:
            yield Problem(
                "topology", f"{profile.topology} needs hosts in group {pool}; {src} has groups: {groups}"
            )
    if not prefill or not decode:
        return
    both = [h for h in prefill if h in decode]
    if profile.topology == "same-host":
        if not both:
            yield Problem(
                "topology",
                f"same-host needs a host in both groups prefill and decode; in {src} prefill is "
                f"{', '.join(prefill)} and decode is {', '.join(decode)}",
            )
        alone = [h for h in [*prefill, *decode] if h not in both]
        if both and alone:
            yield Problem(
                "topology",
                f"same-host runs prefill and decode on the same hosts; {', '.join(dict.fromkeys(alone))} "
                f"in {src} is in only one of the groups prefill/decode",
            )
    elif both:
        yield Problem(
            "topology",
            f"cross-host needs distinct prefill and decode hosts; {', '.join(both)} in {src} is in both "
            "(use a same-host profile for that)",
        )


def _gateway_problems(profile: Profile, inventory: Inventory) -> Iterable[Problem]:
    """A gateway host needs a colocated pool to route to: without one it would silently get nothing."""
    if profile.pools.colocated is not None:
        return
    for host in inventory.group("gateway"):
        yield Problem(
            "pools.colocated",
            f"host {host.name} is in group gateway of {inventory.source}, but without a colocated pool it "
            "would get no gateway (the gateway routes between the colocated and the P/D pool); add "
            f"pools.colocated with hosts in group colocated, or take {host.name} out of group gateway",
        )


def _host_gpu_problems(pool: str, spec: PoolSpec, host: Host, inventory: Inventory) -> Iterable[Problem]:
    """The pool's GPU indices must exist on every host of the pool (inventory var `gpus`)."""
    if not host.gpus:
        yield Problem(
            f"pools.{pool}.gpus",
            f"host {host.name} declares no gpus in {inventory.source} (inventory var gpus, e.g. [0, 1])",
        )
        return
    missing = [gpu for gpu in spec.gpus if gpu not in host.gpus]
    if missing:
        yield Problem(
            f"pools.{pool}.gpus",
            f"GPU {', '.join(map(str, missing))} is not on host {host.name} "
            f"({inventory.source} declares gpus {list(host.gpus)})",
        )


def _address_problems(profile: Profile, inventory: Inventory) -> Iterable[Problem]:
    """Cross-host KV transfer needs each P/D host's address to be reachable from the others."""
    if profile.topology != "cross-host" or profile.kv_transfer.side_channel_host != "auto":
        return
    for host in [*inventory.group("prefill"), *inventory.group("decode")]:
        if is_loopback(host.address):
            yield Problem(
                "kv_transfer.side_channel_host",
                f"auto uses host {host.name}'s address {host.address!r}, which other hosts cannot reach; "
                f"set ansible_host in {inventory.source}",
            )


def _rdma_host_problems(profile: Profile, inventory: Inventory) -> Iterable[Problem]:
    """With RDMA on, every prefill/decode host must declare its RDMA devices and netdev."""
    if not profile.rdma.enabled or not profile.disaggregated:
        return
    names = dict.fromkeys(h.name for h in [*inventory.group("prefill"), *inventory.group("decode")])
    for host in (inventory.hosts[name] for name in names):
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
