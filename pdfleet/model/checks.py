"""Semantic checks the schema cannot express: topology vs pools, kv_role, connector vs pinned vLLM,
ports and GPUs per host, and (with an inventory) groups, GPU indices and RDMA devices of real hosts."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.model import connectors
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.inventory import Host, Inventory

# pdfleet.model.profile imports this module inside its functions (the cycle goes with the profile split).
from pdfleet.model.profile import (
    DEFAULT_KV_ROLES,
    KVTransferSpec,
    PoolSpec,
    Profile,
    VllmSpec,
    check_against_inventory,
    list_profiles,
    load_profile,
    raw_profile,
)

# vllm serve flags pdfleet renders from pool keys; extra_args must not set them a second time.
MANAGED_FLAGS: dict[str, str] = {
    "--host": "the host's inventory address",
    "--port": "{pool}.port",
    "--tensor-parallel-size": "{pool}.tensor_parallel_size",
    "-tp": "{pool}.tensor_parallel_size",
    "--max-num-batched-tokens": "{pool}.max_num_batched_tokens",
    "--gpu-memory-utilization": "{pool}.gpu_memory_utilization",
    "--max-num-seqs": "{pool}.max_num_seqs",
    "--kv-cache-dtype": "{pool}.kv_cache_dtype",
    "--enable-chunked-prefill": "{pool}.enable_chunked_prefill",
    "--no-enable-chunked-prefill": "{pool}.enable_chunked_prefill",
    "--max-model-len": "{pool}.max_model_len or model.max_model_len",
    "--kv-transfer-config": "kv_transfer and {pool}.kv_role",
    "--served-model-name": "model.served_model_name",
}


@dataclass(frozen=True)
class Problem:
    """One semantic problem: the profile key path it concerns and what is wrong / allowed."""

    path: str
    message: str


def profile_problems(profile: Profile) -> list[Problem]:
    """Every problem visible from the profile alone (no inventory)."""
    version = connectors.parse_version(profile.vllm.version)
    problems = list(_version_problems(profile, version))
    problems += _topology_problems(profile)
    problems += _kv_role_problems(profile)
    if profile.disaggregated and version is not None and version >= connectors.MIN_VLLM:
        problems += _connector_problems(profile, version)
    problems += _side_channel_host_problems(profile)
    for pool, spec in profile.pools.items():
        problems += _pool_problems(profile, pool, spec)
    problems += _gateway_problems(profile)
    problems += _driver_problems(profile)
    problems += _mirror_problems(profile)
    if profile.topology == "same-host":
        problems += _shared_host_problems(profile, ["prefill", "decode"], gateway=False, where=None)
    problems += _shared_host_problems(profile, [], gateway=True, where=None)
    return problems


def inventory_problems(profile: Profile, inventory: Inventory) -> list[Problem]:
    """Problems of this profile on these hosts: groups, GPU indices, RDMA devices, port/GPU clashes."""
    problems = list(_group_problems(profile, inventory))
    for pool, spec in profile.pools.items():
        for host in inventory.group(pool):
            problems += _host_gpu_problems(pool, spec, host, inventory)
    problems += _address_problems(profile, inventory)
    problems += _rdma_host_problems(profile, inventory)
    for host in inventory.hosts.values():
        pools = [pool for pool, _ in profile.pools.items() if host.in_group(pool)]
        problems += _shared_host_problems(profile, pools, gateway=host.in_group("gateway"), where=host)
    return _dedupe(problems)


def stage_problem(profile: Profile, stage: str) -> str | None:
    """Why a rollout stage cannot be used with this profile, or None (for the rollout/gateway code)."""
    if stage not in profile.gateway.stages:
        return f"{stage!r} is not a stage in gateway.stages; stages: {', '.join(profile.gateway.stages)}"
    return None


# --------------------------------------------------------------------------- profile-only checks


def _version_problems(profile: Profile, version: connectors.Version | None) -> Iterable[Problem]:
    """The pin must be an exact release pdfleet knows, and version-gated keys must exist in it."""
    if version is None:
        yield Problem(
            "vllm.version", f"must be an exact vLLM release like 0.11.0 (got {profile.vllm.version!r})"
        )
        return
    if version < connectors.MIN_VLLM:
        yield Problem(
            "vllm.version",
            f"vLLM {profile.vllm.version} is older than pdfleet supports "
            f"(>= {connectors.fmt(connectors.MIN_VLLM)})",
        )
    policy = profile.kv_transfer.load_failure_policy
    if policy is not None and version <= connectors.LOAD_FAILURE_POLICY_ABSENT_UNTIL:
        yield Problem(
            "kv_transfer.load_failure_policy",
            f"vLLM {profile.vllm.version} has no kv_load_failure_policy (added after "
            f"{connectors.fmt(connectors.LOAD_FAILURE_POLICY_ABSENT_UNTIL)}); "
            "remove it or pin a newer vllm.version",
        )


def _topology_problems(profile: Profile) -> Iterable[Problem]:
    """Which pools a topology runs: colocated alone, or prefill and decode (plus an optional colocated
    baseline pool beside them)."""
    pools = profile.pools
    if profile.topology == "colocated":
        if pools.colocated is None:
            yield Problem(
                "pools.colocated", "required key is missing: topology colocated runs pools.colocated"
            )
        for pool in ("prefill", "decode"):
            if getattr(pools, pool) is not None:
                yield Problem(
                    f"pools.{pool}",
                    "a colocated profile runs only pools.colocated; "
                    "remove it or use topology same-host/cross-host",
                )
        return
    for pool in ("prefill", "decode"):
        if getattr(pools, pool) is None:
            yield Problem(
                f"pools.{pool}",
                f"required key is missing: topology {profile.topology} runs prefill and decode",
            )
    # pools.colocated beside prefill/decode is the baseline pool the gateway routes between and falls
    # back to during a staged rollout; it runs on the inventory's colocated group.


def _kv_role_problems(profile: Profile) -> Iterable[Problem]:
    """prefill is kv_producer, decode kv_consumer, colocated has none; kv_both is never rendered."""
    for pool, spec in profile.pools.items():
        expected = DEFAULT_KV_ROLES[pool]
        if spec.kv_role == expected:
            continue
        if expected is None:
            yield Problem(
                f"pools.{pool}.kv_role", "the colocated pool runs without a KV connector; remove kv_role"
            )
        elif spec.kv_role == "kv_both":
            yield Problem(
                f"pools.{pool}.kv_role",
                f"kv_both is not used: prefill is kv_producer and decode kv_consumer; use {expected}",
            )
        else:
            yield Problem(
                f"pools.{pool}.kv_role", f"must be {expected} for the {pool} pool (got {spec.kv_role})"
            )


def _connector_problems(profile: Profile, version: connectors.Version) -> Iterable[Problem]:
    """The connector must be real for the pinned vLLM, renderable by pdfleet, and fit the engine."""
    kv = profile.kv_transfer
    problem = connectors.check_connector(kv.connector, version)
    if problem is not None:
        yield Problem("kv_transfer.connector", problem.message)
        return
    if profile.vllm.engine == "sim" and kv.connector != NIXL:
        yield Problem(
            "kv_transfer.connector",
            f"the simulator (vllm.engine: sim) speaks NixlConnector's protocol only (got {kv.connector})",
        )
    if kv.connector == MOONCAKE and kv.mooncake_protocol == "rdma" and not profile.rdma.enabled:
        yield Problem(
            "kv_transfer.mooncake_protocol",
            "rdma needs rdma.enabled: true; enable RDMA or use mooncake_protocol: tcp",
        )


def _is_loopback(value: str) -> bool:
    """localhost, 127.0.0.0/8, ::1 or the wildcard: not an address another host can reach."""
    if value.lower() in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _side_channel_host_problems(profile: Profile) -> Iterable[Problem]:
    """Cross-host NIXL: each prefill host must advertise its own reachable address."""
    kv = profile.kv_transfer
    if profile.topology != "cross-host" or kv.connector != NIXL or kv.side_channel_host == "auto":
        return
    if _is_loopback(kv.side_channel_host):
        yield Problem(
            "kv_transfer.side_channel_host",
            f"{kv.side_channel_host!r} is not reachable from other hosts in a cross-host topology; "
            "use auto (each host's ansible_host)",
        )
    else:
        yield Problem(
            "kv_transfer.side_channel_host",
            f"a fixed address ({kv.side_channel_host!r}) would be advertised by every host in a cross-host "
            "topology; use auto (each host's ansible_host)",
        )


def _pool_problems(profile: Profile, pool: str, spec: PoolSpec) -> Iterable[Problem]:
    """Per-pool limits vLLM itself would refuse at start-up, caught before anything is installed."""
    where = f"pools.{pool}"
    if len(set(spec.gpus)) != len(spec.gpus):
        yield Problem(f"{where}.gpus", f"lists a GPU twice (got {spec.gpus})")
    if len(spec.gpus) != spec.tensor_parallel_size:
        yield Problem(
            f"{where}.gpus",
            f"lists {len(spec.gpus)} GPU(s) but tensor_parallel_size is {spec.tensor_parallel_size}; "
            "an instance uses exactly tensor_parallel_size GPUs",
        )
    if spec.max_num_batched_tokens < spec.max_num_seqs:
        yield Problem(
            f"{where}.max_num_batched_tokens",
            f"must be >= max_num_seqs ({spec.max_num_seqs}) (got {spec.max_num_batched_tokens})",
        )
    max_len = spec.max_model_len or profile.model.max_model_len
    if not spec.enable_chunked_prefill and max_len and spec.max_num_batched_tokens < max_len:
        yield Problem(
            f"{where}.max_num_batched_tokens",
            f"must be >= max_model_len ({max_len}) when enable_chunked_prefill is false "
            f"(got {spec.max_num_batched_tokens})",
        )
    for index, arg in enumerate(spec.extra_args):
        flag = arg.split("=", 1)[0]
        base = flag.split(".", 1)[0]  # dotted --kv-transfer-config.kv_role form
        if base in MANAGED_FLAGS:
            yield Problem(
                f"{where}.extra_args[{index}]",
                f"{flag} is rendered by pdfleet from {MANAGED_FLAGS[base].format(pool=where)}; "
                "set that key instead",
            )


def _gateway_problems(profile: Profile) -> Iterable[Problem]:
    """The active stage must be defined, and the long-prompt threshold reachable by some prompt."""
    problem = stage_problem(profile, profile.gateway.stage)
    if problem is not None:
        yield Problem("gateway.stage", problem)
    max_len = profile.model.max_model_len
    if max_len is not None and profile.gateway.long_prompt_tokens >= max_len:
        yield Problem(
            "gateway.long_prompt_tokens",
            f"must be < model.max_model_len ({max_len}), or no prompt is ever long "
            f"(got {profile.gateway.long_prompt_tokens})",
        )


def _driver_problems(profile: Profile) -> Iterable[Problem]:
    """A pinned driver version must belong to the pinned branch (570.x for branch 570)."""
    gpu = profile.gpu
    if gpu.driver_version is not None and gpu.driver_version.split(".", 1)[0] != gpu.driver_branch:
        yield Problem(
            "gpu.driver_version",
            f"{gpu.driver_version} is not in driver_branch {gpu.driver_branch}; "
            f"use a {gpu.driver_branch}.x version or change driver_branch",
        )


def _mirror_problems(profile: Profile) -> Iterable[Problem]:
    """Mirrors are http(s) URLs; a trusted PyPI host only makes sense with a PyPI mirror."""
    mirrors = profile.mirrors
    for key in ("apt", "pypi", "cuda_repo"):
        value = getattr(mirrors, key)
        if value is not None and not value.startswith(("http://", "https://")):
            yield Problem(f"mirrors.{key}", f"must be an http:// or https:// URL (got {value!r})")
    if mirrors.pypi_trusted_host is not None and mirrors.pypi is None:
        yield Problem("mirrors.pypi_trusted_host", "is set but mirrors.pypi is not; set both or neither")


# --------------------------------------------------------------------------- per-host checks


def _host_ports(profile: Profile, pools: list[str], gateway: bool) -> list[tuple[int, str]]:
    """Every TCP port a host with these pools (and maybe the gateway) listens on, with its key path."""
    ports: list[tuple[int, str]] = []
    for pool in pools:
        spec = getattr(profile.pools, pool)
        if spec is None:
            continue
        ports.append((spec.port, f"pools.{pool}.port"))
        side = profile.side_channel_port_for(pool)
        if side is not None:
            label = "kv_transfer.side_channel_port" + ("+1" if pool == "decode" else "")
            ports.append((side, f"{label} ({pool} side channel)"))
        boot = profile.kv_transfer.bootstrap_port_for(pool) if profile.disaggregated else None
        if boot is not None:
            ports.append((boot, "kv_transfer.mooncake_bootstrap_port"))
    if gateway:
        gw = profile.gateway
        ports += [(gw.port, "gateway.port"), (gw.router_port, "gateway.router_port")]
        if gw.admin_port is not None:
            ports.append((gw.admin_port, "gateway.admin_port"))
    return ports


def _shared_host_problems(
    profile: Profile, pools: list[str], gateway: bool, where: Host | None
) -> list[Problem]:
    """Ports and GPUs must be distinct among everything one host runs."""
    problems: list[Problem] = []
    on_host = f" on host {where.name}" if where else " on a same-host host" if len(pools) > 1 else ""
    seen: dict[int, str] = {}
    for port, label in _host_ports(profile, pools, gateway):
        if port in seen:
            key = label.split(" ", 1)[0]
            problems.append(Problem(key, f"port {port} is used twice{on_host}: by {seen[port]} and {label}"))
        else:
            seen[port] = label
    owners: dict[int, str] = {}
    for pool in pools:
        spec = getattr(profile.pools, pool)
        if spec is None:
            continue
        for gpu in spec.gpus:
            if gpu in owners and owners[gpu] != pool:
                problems.append(
                    Problem(
                        f"pools.{pool}.gpus",
                        f"GPU {gpu} is given to both pools.{owners[gpu]} and pools.{pool}{on_host}; "
                        "pools on one host need different GPUs",
                    )
                )
            owners.setdefault(gpu, pool)
    return problems


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
        if _is_loopback(host.address):
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


# --------------------------------------------------------------------------- survey (invoke profiles)


@dataclass(frozen=True)
class ProfileStatus:
    """One line of `invoke profiles`: what a profile is and every problem it has (empty = valid)."""

    name: str
    topology: str
    engine: str
    connector: str
    vllm: str
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when the profile validated (and fitted the inventory, if one was given)."""
        return not self.problems


def survey_profiles(
    profiles_dir: Path, inventory: Inventory | None = None, names: Iterable[str] | None = None
) -> list[ProfileStatus]:
    """Validate each listed profile (or every one in the directory), optionally against an inventory."""
    default_engine = VllmSpec.model_fields["engine"].default
    default_connector = KVTransferSpec.model_fields["connector"].default
    statuses = []
    for name in list(names) if names is not None else list_profiles(profiles_dir):
        try:
            profile = load_profile(name, profiles_dir)
            if inventory is not None:
                check_against_inventory(profile, inventory)
            problems: tuple[str, ...] = ()
        except ValidationError as exc:
            problems = tuple(getattr(exc, "problems", None) or [str(exc)])
        raw = raw_profile(name, profiles_dir)
        kv = raw.get("kv_transfer") if isinstance(raw.get("kv_transfer"), dict) else {}
        vllm = raw.get("vllm") if isinstance(raw.get("vllm"), dict) else {}
        topology = str(raw.get("topology", "?"))
        statuses.append(
            ProfileStatus(
                name=name,
                topology=topology,
                engine=str(vllm.get("engine", default_engine)),
                connector="-" if topology == "colocated" else str(kv.get("connector", default_connector)),
                vllm=str(vllm.get("version", "?")),
                problems=problems,
            )
        )
    return statuses
