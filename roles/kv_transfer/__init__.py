"""kv_transfer: NIXL or Mooncake in the vLLM venv, and the host-wide /etc/pdfleet/kv-transfer.env.

Mooncake's transfer engine links Debian's libibverbs1 (even for its TCP protocol) and libnuma1: the role
installs them (from the site's apt repository, the lab's mirror) wherever the engine goes into the venv.
The env file (mode 0600) carries UCX_TLS, UCX_NET_DEVICES, the computed RoCE v2 GID index
(UCX_IB_GID_INDEX, MC_GID_INDEX), VLLM_MOONCAKE_BOOTSTRAP_PORT on prefill hosts and
WITH_NVIDIA_PEERMEM for Mooncake; every vLLM unit loads it, so a change restarts each of them.
Per-instance side-channel settings belong to the services role.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pdfleet.fleet.host_layout import KV_ENV_FILE
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, instance_restart
from pdfleet.hw.gpu import resolve_gpudirect
from pdfleet.hw.gpu_facts import KernelFact, NvidiaPciFact
from pdfleet.hw.kv import kv_env, kv_requirement, render_env, sim_requirements, uses_rdma
from pdfleet.hw.rdma import RdmaError, check_devices, compute_gid_index, netdev_of
from pdfleet.hw.rdma_facts import NetdevFact, RdmaSysfsFact
from pdfleet.model.connectors import MOONCAKE
from pdfleet.ops.apt import AptPackage, AptPackages, AptUpdate
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import File
from pdfleet.ops.pip import PipRequirements

if TYPE_CHECKING:
    from pdfleet.model.profile import Profile

NAME = "kv_transfer"
# mooncake/engine.so links libibverbs.so.1 and libnuma.so.1 (0.3.13.post1, the non-CUDA build included;
# the lab image has neither: `ldd` on lab-p1 found libnuma.so.1 missing once libibverbs1 was there)
MOONCAKE_DEBS: tuple[str, ...] = ("libibverbs1", "libnuma1")
APT_PACKAGES: tuple[str, ...] = MOONCAKE_DEBS


def applies(ctx: RoleContext) -> bool:
    """Hosts running a prefill or decode instance (colocated pools move no KV)."""
    return any(inst.kv_role for inst in ctx.instances)


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    """GPUs and kernel (the GPUDirect mode); the RDMA devices where KV moves over RDMA (the GID index)."""
    rdma = (RdmaSysfsFact(),) if uses_rdma(ctx.kv_profile, ctx.host) else ()
    apt = (AptPackages(MOONCAKE_DEBS),) if needs_mooncake_debs(ctx.kv_profile) else ()
    return (NvidiaPciFact(), KernelFact(), *rdma, *apt)


def needs_mooncake_debs(profile: Profile) -> bool:
    """Mooncake's engine goes into the venv (a real engine, or the simulator's with sim_library)."""
    sim_without = profile.vllm.engine == "sim" and not profile.kv_transfer.sim_library
    return profile.kv_transfer.connector == MOONCAKE and not sim_without


def mooncake_debs(facts: FactSource) -> Iterable[Operation]:
    """libibverbs1 and libnuma1 installed (package lists refreshed first when one is missing: the mirror
    may have gained it since the host's last update)."""
    installed = facts.get(AptPackages(MOONCAKE_DEBS))
    if any(installed.get(name) is None for name in MOONCAKE_DEBS):
        yield AptUpdate(max_age_minutes=0)
    for name in MOONCAKE_DEBS:
        yield AptPackage(name)


def files(ctx: RoleContext) -> list[RenderedFile]:
    return []  # the env file holds the GID index and GPUDirect mode found on the host (facts)


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return []


def gid_index(ctx: RoleContext, facts: FactSource) -> tuple[int | None, str]:
    """The RoCE v2 GID index for the env file, or None with the reason it is not set."""
    if not uses_rdma(ctx.kv_profile, ctx.host):
        return None, "KV does not move over RDMA on this host"
    found = facts.get(RdmaSysfsFact())
    declared = tuple(ctx.host.rdma_devices)
    problems = check_devices(declared, found)
    if problems:
        return None, "; ".join(problems)
    netdevs = {nd: facts.get(NetdevFact(nd)) for nd in netdev_of(found, declared).values()}
    try:
        return compute_gid_index(found, declared, netdevs, ctx.profile.rdma.gid_index), ""
    except RdmaError as exc:
        return None, str(exc)


def gpudirect_mode(ctx: RoleContext, facts: FactSource) -> str:
    """The GPUDirect path the gpu_driver role sets up here ("none" without GPUs or RDMA)."""
    if not facts.get(NvidiaPciFact()).gpus:
        return "none"
    try:
        kernel = facts.get(KernelFact())
        return resolve_gpudirect(ctx.profile.gpu, kernel, uses_rdma(ctx.kv_profile, ctx.host)).mode
    except ValueError:
        return "none"  # the gpu_driver role reports it as an error


def sim_library(profile: Profile) -> Iterable[Operation | Skip]:
    """The connector's CPU build in the simulator's venv (kv_transfer.sim_library), for `verify --kv-path`:
    nixl-cu12 without its dependencies (torch) and numpy beside it, or Mooncake's non-CUDA engine."""
    pins = sim_requirements(profile.kv_transfer.connector)
    if not pins:
        yield Skip("KV transfer library", f"no CPU build known for {profile.kv_transfer.connector}")
        return
    mirrors = profile.mirrors
    venv = profile.vllm.venv.rstrip("/")
    for reqs, extra in pins:
        yield PipRequirements(
            venv, reqs, index_url=mirrors.pypi, trusted_host=mirrors.pypi_trusted_host, extra_args=extra
        )


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    """The transfer library in the venv (not for the simulator) and the env file for every vLLM unit."""
    profile = ctx.kv_profile  # the host's P/D model's connector
    requirement = kv_requirement(profile)
    if needs_mooncake_debs(profile):
        yield from mooncake_debs(facts)
    if profile.vllm.engine == "sim" and profile.kv_transfer.sim_library:
        yield from sim_library(profile)
    elif profile.vllm.engine == "sim":
        reason = (
            "engine: sim: the simulator models the transfer (kv_transfer.sim_library installs the library)"
        )
        yield Skip("KV transfer library", reason)
    elif requirement is None:
        yield Skip("KV transfer library", f"no transfer library known for {profile.kv_transfer.connector}")
    else:
        mirrors = profile.mirrors
        yield PipRequirements(
            profile.vllm.venv.rstrip("/"),
            (requirement,),
            index_url=mirrors.pypi,
            trusted_host=mirrors.pypi_trusted_host,
        )
    index, why = gid_index(ctx, facts)
    if index is None and uses_rdma(profile, ctx.host):
        yield Skip("UCX_IB_GID_INDEX/MC_GID_INDEX", why)
    is_prefill = any(inst.pool == "prefill" for inst in ctx.instances)
    env = kv_env(profile, ctx.host, index, gpudirect_mode(ctx, facts), is_prefill)
    restarts = tuple(instance_restart(inst) for inst in ctx.instances)
    yield File(KV_ENV_FILE, render_env(env), mode="0600", owner="root", group="root", notify=restarts)
