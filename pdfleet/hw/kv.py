"""KV-transfer decisions: which wheel goes into the vLLM venv, the host-wide env file, Mooncake's config.

Names come from reference/vllm-pd.md: NIXL (`nixl[cu12]`/`nixl[cu13]`, §2.6), Mooncake
(`mooncake-transfer-engine`, `-cuda13`; `VLLM_MOONCAKE_BOOTSTRAP_PORT` on prefillers;
`kv_connector_extra_config` keys `mooncake_protocol`, `device_name`; `WITH_NVIDIA_PEERMEM`, §1.3),
UCX (`UCX_TLS`, `UCX_NET_DEVICES`, `UCX_IB_GID_INDEX`) and Mooncake's `MC_GID_INDEX` (provisioning.md §2.2).
Per-instance `VLLM_NIXL_SIDE_CHANNEL_HOST/PORT` are written by the services role, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pdfleet.hw.gpu import cuda_major
from pdfleet.hw.rdma import ucx_net_devices
from pdfleet.model.connectors import MOONCAKE, NIXL
from pdfleet.model.vllm_release_data import RELEASES
from pdfleet.model.vllm_releases import find_release
from pdfleet.ops.systemd import env_value
from pdfleet.sim.kv_library import FRACTION_ENV, LIBRARY_ENV

if TYPE_CHECKING:
    from pdfleet.model.inventory import Host
    from pdfleet.model.profile import Profile


# UCX's TCP transport between hosts (measured by issue 29's probe, two processes on a bridge): a dropped data
# port held add_remote_agent ~130 s at the kernel's 6 SYN retries, 7 s at 2; a partition mid-transfer hung
# with no error until UCX_TCP_USER_TIMEOUT. Rendered where KV moves over TCP (cross-host without RDMA).
UCX_TCP_TIMEOUTS: dict[str, str] = {"UCX_TCP_SYN_CNT": "2", "UCX_TCP_USER_TIMEOUT": "10s"}
# Mooncake's transfer engine between hosts (names from mooncake-transfer-engine-non-cuda 0.3.13.post1's
# engine.so and Mooncake's source): a transfer the peer stopped answering fails after MC_TRANSFER_TIMEOUT
# seconds (default 30; 10 as UCX's). Over its TCP transport a call with more descriptors than
# MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER (default 1024) is refused, failing as -1 (issue 29's probe: 4096
# refused): set to the source's maximum, 65535.
MOONCAKE_TIMEOUTS: dict[str, str] = {"MC_TRANSFER_TIMEOUT": "10"}
MOONCAKE_TCP_QUEUE: dict[str, str] = {"MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "65535"}


def uses_rdma(profile: Profile, host: Host) -> bool:
    """KV moves over RDMA: cross-host, RDMA enabled in the profile, devices declared for the host.

    Same-host profiles move KV over PCIe/NVLink (UCX cuda_ipc), colocated ones do not move it.
    """
    return profile.topology == "cross-host" and bool(profile.rdma.enabled) and bool(host.rdma_devices)


def kv_requirement(profile: Profile) -> str | None:
    """The pip requirement of the connector's transfer library, CUDA build matching the driver pin."""
    connector = profile.kv_transfer.connector
    cuda = cuda_major(profile.gpu)
    if connector == NIXL:
        rel = find_release(profile.vllm.version, RELEASES)
        if rel is not None and rel.handshake.min_nixl:  # checked at worker start; the cuXX extras are no-ops
            return f"nixl>={rel.handshake.min_nixl}"
        return f"nixl[cu{cuda}]"
    if connector == MOONCAKE:
        return "mooncake-transfer-engine-cuda13" if cuda == 13 else "mooncake-transfer-engine"
    return None


# engine: sim with kv_transfer.sim_library: the CPU builds issue 29's probe moved bytes with. nixl-cu12 names
# torch (and the `nixl` meta package both CUDA builds) as dependencies it does not import for DRAM, hence
# --no-deps and numpy apart; Mooncake's non-CUDA engine resolves (aiohttp, requests, msgpack).
SIM_NIXL = "nixl-cu12==1.5.1"
SIM_MOONCAKE = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
# the module the simulator imports from each (pdfleet.sim.kv_library, pdfleet.sim.kv_mooncake)
SIM_MODULES: dict[str, str] = {
    "nixl_cu12": "nixl-cu12",
    "numpy": "numpy",
    "mooncake": "mooncake-transfer-engine-non-cuda",
}


def sim_requirements(connector: str) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...]:
    """((requirements, extra pip args), ...) of the connector's CPU build for the simulator's venv."""
    if connector == NIXL:
        return (((SIM_NIXL,), ("--no-deps",)), (("numpy",), ()))
    if connector == MOONCAKE:
        return (((SIM_MOONCAKE,), ()),)
    return ()


def sim_library_env(profile: Profile) -> dict[str, str]:
    """engine: sim with kv_transfer.sim_library: the simulator moves each request's scaled KV bytes through
    the connector's library (NIXL: `pdfleet.sim.kv_library`, Mooncake's engine: `pdfleet.sim.kv_mooncake`);
    {} otherwise."""
    kv = profile.kv_transfer
    library = {NIXL: "nixl", MOONCAKE: "mooncake"}.get(kv.connector)
    if profile.vllm.engine != "sim" or not kv.sim_library or library is None:
        return {}
    return {LIBRARY_ENV: library, FRACTION_ENV: repr(kv.sim_bytes_fraction)}


def kv_import_name(profile: Profile) -> str | None:
    """The Python module that proves the library is importable in the venv (checked by verify); with
    kv_transfer.sim_library, NIXL's CPU build alone (nixl-cu12, without the `nixl` meta package)."""
    sim = profile.vllm.engine == "sim" and profile.kv_transfer.sim_library
    return {NIXL: "nixl_cu12" if sim else "nixl", MOONCAKE: "mooncake"}.get(profile.kv_transfer.connector)


def kv_connector_extra_config(profile: Profile, host: Host) -> dict[str, Any]:
    """Mooncake's protocol and RDMA device whitelist for --kv-transfer-config; {} for other connectors."""
    kv = profile.kv_transfer
    if kv.connector != MOONCAKE:
        return {}
    extra: dict[str, Any] = {"mooncake_protocol": kv.mooncake_protocol}
    if kv.mooncake_protocol == "rdma" and host.rdma_devices:
        extra["device_name"] = ",".join(host.rdma_devices)
    return extra


def kv_env(
    profile: Profile, host: Host, gid_index: int | None, gpudirect: str, is_prefill: bool
) -> dict[str, str]:
    """The host-wide /etc/pdfleet/kv-transfer.env, in a stable order."""
    kv = profile.kv_transfer
    env: dict[str, str] = {}
    rdma = uses_rdma(profile, host)
    env["UCX_TLS"] = kv.ucx_tls or "all"
    if kv.ucx_tcp_port_range:
        env["UCX_TCP_PORT_RANGE"] = kv.ucx_tcp_port_range
    if profile.topology == "cross-host" and not rdma and kv.connector == NIXL:
        env.update(UCX_TCP_TIMEOUTS)  # KV moves over UCX's TCP transport: a hang becomes an error
    if rdma:
        env["UCX_NET_DEVICES"] = ucx_net_devices(tuple(host.rdma_devices))
    if rdma and gid_index is not None:
        env["UCX_IB_GID_INDEX"] = str(gid_index)
        env["MC_GID_INDEX"] = str(gid_index)
    env.update(sim_library_env(profile))
    if profile.topology == "cross-host" and kv.connector == MOONCAKE:
        env.update(MOONCAKE_TIMEOUTS)  # a peer that stops answering: an error, not a 30 s wait
        if kv.mooncake_protocol == "tcp":
            env.update(MOONCAKE_TCP_QUEUE)
    if kv.connector == MOONCAKE:
        if is_prefill:
            env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = str(kv.mooncake_bootstrap_port)
        # Mooncake registers GPU memory with DMA-BUF unless told to use nvidia-peermem.
        env["WITH_NVIDIA_PEERMEM"] = "1" if gpudirect == "peermem" else "0"
    return env


def render_env(env: dict[str, str]) -> str:
    """systemd EnvironmentFile text; values quoted like in every env file pdfleet writes."""
    header = "# Written by pdfleet (kv_transfer role); loaded by every vLLM unit on this host.\n"
    return header + "".join(f"{k}={env_value(v)}\n" for k, v in env.items())
