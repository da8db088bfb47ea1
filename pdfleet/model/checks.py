"""Semantic checks of a profile the schema cannot express: topology vs pools, kv_role, connector vs
pinned vLLM, extra_args vs rendered flags, ports and GPUs that one host would use twice.

Checks that need the hosts (groups, GPU indices, RDMA devices) are in inventory_checks.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass

from pdfleet.model import connectors
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.inventory import Host
from pdfleet.model.profile import DEFAULT_KV_ROLES, PoolSpec, Profile, ProfileError
from pdfleet.model.release_checks import release_problems
from pdfleet.model.rollout import rollout_problems
from pdfleet.model.vllm_release_data import NEWEST, RELEASES
from pdfleet.model.vllm_releases import Release, find_release

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


def problems_error(profile: Profile, problems: Iterable[Problem]) -> ProfileError:
    """One error listing every problem as `file: key.path: message` (the file that set the key)."""
    return ProfileError([f"{profile.origin_of(p.path)}: {p.path}: {p.message}" for p in problems])


def profile_problems(profile: Profile) -> list[Problem]:
    """Every problem visible from the profile alone (no inventory)."""
    version = connectors.parse_version(profile.vllm.version)
    problems = list(_version_problems(profile, version))
    rel = find_release(profile.vllm.version, RELEASES) if version is not None else None
    if rel is not None:
        problems += [Problem(path, message) for path, message in release_problems(profile, rel)]
    problems += _topology_problems(profile)
    problems += _kv_role_problems(profile)
    if profile.disaggregated and rel is not None:
        problems += _connector_problems(profile, rel)
    problems += _side_channel_host_problems(profile)
    for pool, spec in profile.pools.items():
        problems += _pool_problems(profile, pool, spec)
    problems += _gateway_problems(profile)
    problems += [Problem(p, m) for p, m in rollout_problems(profile.rollout, profile.gateway.stages)]
    problems += _driver_problems(profile)
    problems += _mirror_problems(profile)
    if profile.topology == "same-host":
        problems += shared_host_problems(profile, ["prefill", "decode"], gateway=False, where=None)
    problems += shared_host_problems(profile, [], gateway=True, where=None)
    return problems


def stage_problem(profile: Profile, stage: str) -> str | None:
    """Why a rollout stage cannot be used with this profile, or None (for the rollout/gateway code)."""
    if stage not in profile.gateway.stages:
        return f"{stage!r} is not a stage in gateway.stages; stages: {', '.join(profile.gateway.stages)}"
    return None


# --------------------------------------------------------------------------- profile-only checks


def _version_problems(profile: Profile, version: connectors.Version | None) -> Iterable[Problem]:
    """The pin must be an exact release the facts table has (`vllm_release_data`)."""
    if version is None:
        yield Problem(
            "vllm.version", f"must be an exact vLLM release like {NEWEST} (got {profile.vllm.version!r})"
        )
        return
    if version < connectors.MIN_VLLM:
        yield Problem(
            "vllm.version",
            f"vLLM {profile.vllm.version} is older than pdfleet supports "
            f"(>= {connectors.fmt(connectors.MIN_VLLM)})",
        )
        return
    if find_release(profile.vllm.version, RELEASES) is None:
        yield Problem(
            "vllm.version",
            f"pdfleet has no facts for vLLM {profile.vllm.version} (it knows {', '.join(RELEASES)}); "
            f"pin one of those, or derive the table for it: python -m tools.vllm_facts "
            f"{profile.vllm.version} --write",
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


SIM_CONNECTORS = (NIXL, MOONCAKE)  # the P/D protocols pdfleet-sim plays (docs/sim.md)


def _connector_problems(profile: Profile, rel: Release) -> Iterable[Problem]:
    """The connector must be real for the pinned vLLM, renderable by pdfleet, and fit the engine."""
    kv = profile.kv_transfer
    problem = connectors.check_connector(kv.connector, rel)
    if problem is not None:
        yield Problem("kv_transfer.connector", problem.message)
        return
    if profile.vllm.engine == "sim" and kv.connector not in SIM_CONNECTORS:
        yield Problem(
            "kv_transfer.connector",
            f"the simulator (vllm.engine: sim) speaks {' and '.join(SIM_CONNECTORS)}'s protocols only "
            f"(got {kv.connector})",
        )
    if kv.connector == MOONCAKE and kv.mooncake_protocol == "rdma" and not profile.rdma.enabled:
        yield Problem(
            "kv_transfer.mooncake_protocol",
            "rdma needs rdma.enabled: true; enable RDMA or use mooncake_protocol: tcp",
        )


def is_loopback(value: str) -> bool:
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
    if is_loopback(kv.side_channel_host):
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
    gw = profile.gateway
    if _control_path(gw.client_key_file) == _control_path(gw.admin_key_file):
        yield Problem(
            "gateway.admin_key_file",
            f"is the same file as gateway.client_key_file ({gw.client_key_file}); the admin key must "
            "differ from the client key (the gateway refuses a keys file holding one key twice)",
        )
    max_len = profile.model.max_model_len
    if max_len is not None and profile.gateway.long_prompt_tokens >= max_len:
        yield Problem(
            "gateway.long_prompt_tokens",
            f"must be < model.max_model_len ({max_len}), or no prompt is ever long "
            f"(got {profile.gateway.long_prompt_tokens})",
        )


def _control_path(path: str) -> str:
    """A control-machine path as compared for identity: `~` expanded, `.`/`..`/`//` folded."""
    return os.path.normpath(os.path.expanduser(path))


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


# --------------------------------------------------------------------------- what one host runs


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
            base = profile.kv_transfer.side_channel_port
            label = "kv_transfer.side_channel_port" + (f"+{side - base}" if side != base else "")
            rel = find_release(profile.vllm.version, RELEASES)
            bound = rel.side_channel_ports(side, spec.tensor_parallel_size) if rel else (side,)
            for rank, port in enumerate(bound):
                what = f"{pool} side channel" + (f", TP rank {rank}" if rank else "")
                ports.append((port, f"{label} ({what})"))
        boot = profile.kv_transfer.bootstrap_port_for(pool) if profile.disaggregated else None
        if boot is not None:
            ports.append((boot, "kv_transfer.mooncake_bootstrap_port"))
    if gateway:
        gw = profile.gateway
        ports += [(gw.port, "gateway.port"), (gw.router_port, "gateway.router_port")]
        if gw.admin_port is not None:
            ports.append((gw.admin_port, "gateway.admin_port"))
    return ports


def shared_host_problems(
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
