"""RoCE checks: declared ports ACTIVE on Ethernet, RoCE v2 GID at the configured index, MTU, QoS, ECN."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.checks.verify import VerifyPlugin, read_env, remote_fact
from pdfleet.fleet.host_layout import KV_ENV_FILE
from pdfleet.hw.kv import uses_rdma
from pdfleet.hw.rdma import (
    PORT,
    ROCE_V2,
    check_devices,
    ecn_converged,
    netdev_of,
    qos_converged,
    qos_tool,
)
from pdfleet.hw.rdma_facts import NetdevFact, QosFact, QosToolsFact, RdmaDevice, RdmaSysfsFact
from pdfleet.model.inventory import Host


def rdma_devices(verify: VerifyPlugin, pd_host: Host, target: Any) -> dict[str, RdmaDevice]:
    """The host's RDMA devices; skips where KV does not move over RDMA (by the host's P/D model)."""
    profile = verify.kv_profile(pd_host)
    if not uses_rdma(profile, pd_host):
        if not any(pd_host.in_group(g) for g in ("prefill", "decode")):
            pytest.skip("runs no prefill/decode pool")
        if profile.topology != "cross-host":
            pytest.skip(f"topology {profile.topology}: KV does not cross hosts")
        if not profile.rdma.enabled:
            pytest.skip("rdma.enabled: false")
        pytest.skip("no rdma_devices declared for this host")
    return remote_fact(target, RdmaSysfsFact())


def netdevs(found: dict[str, RdmaDevice], pd_host: Host) -> list[str]:
    """The netdevs of the host's declared RDMA devices."""
    return list(netdev_of(found, tuple(pd_host.rdma_devices)).values())


def test_rdma_ports_active_ethernet(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = rdma_devices(verify, pd_host, target)
    problems = check_devices(tuple(pd_host.rdma_devices), found)
    assert not problems, "; ".join(problems)


def test_roce_v2_gid_at_configured_index(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = rdma_devices(verify, pd_host, target)
    env = read_env(target, KV_ENV_FILE) or {}
    assert "UCX_IB_GID_INDEX" in env, f"{KV_ENV_FILE} has no UCX_IB_GID_INDEX"
    index = int(env["UCX_IB_GID_INDEX"])
    assert env.get("MC_GID_INDEX", str(index)) == str(index), "MC_GID_INDEX differs from UCX_IB_GID_INDEX"
    for dev in pd_host.rdma_devices:
        port = found[dev].port(PORT) if dev in found else None
        gid = next((g for g in port.gids if g.index == index), None) if port else None
        assert gid is not None, f"{dev} port {PORT} has no GID at index {index}"
        assert gid.type == ROCE_V2 and gid.ipv4, (
            f"{dev} GID {index} is {gid.type} {gid.gid}, not RoCE v2 IPv4"
        )


def test_roce_v2_default_mode(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = rdma_devices(verify, pd_host, target)
    if not verify.profile.rdma.roce_v2:
        pytest.skip("rdma.roce_v2: false")
    wrong = [
        d
        for d in pd_host.rdma_devices
        if d in found and (p := found[d].port(PORT)) and p.default_roce_mode != ROCE_V2
    ]
    assert not wrong, f"RDMA-CM default mode is not RoCE v2 on {', '.join(wrong)}"


def test_mtu(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = rdma_devices(verify, pd_host, target)
    want = verify.profile.rdma.mtu
    wrong = []
    for nd in netdevs(found, pd_host):
        info = remote_fact(target, NetdevFact(nd))
        if info.mtu != want:
            wrong.append(f"{nd}={info.mtu}")
    assert not wrong, f"MTU should be {want}: {', '.join(wrong)}"


def test_pfc_trust_ecn(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = rdma_devices(verify, pd_host, target)
    rdma = verify.profile.rdma
    tool = qos_tool(remote_fact(target, QosToolsFact()))
    if tool is None:
        pytest.skip("neither mlnx_qos nor dcb is installed to read QoS")
    wrong = []
    for nd in netdevs(found, pd_host):
        if not qos_converged(remote_fact(target, QosFact(nd, tool)), rdma.pfc_priority, rdma.dscp):
            wrong.append(f"{nd}: not trust dscp with PFC only on priority {rdma.pfc_priority}")
        ecn = ecn_converged(remote_fact(target, NetdevFact(nd)), rdma.pfc_priority)
        if rdma.ecn and ecn is False:
            wrong.append(f"{nd}: ECN off on priority {rdma.pfc_priority}")
    assert not wrong, "; ".join(wrong)
