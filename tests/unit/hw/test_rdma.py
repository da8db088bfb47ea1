"""rdma decisions and role: device checks, computed GID index, QoS with mlnx_qos or dcb, persistence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import roles.rdma as role
from pdfleet.hw import HardwareError, rdma_facts
from pdfleet.hw.rdma import (
    RdmaError,
    check_devices,
    compute_gid_index,
    qos_commands,
    qos_converged,
    qos_tool,
    roce_script,
    ucx_net_devices,
)
from tests.unit.fleet.helpers import REPO, deploy
from tests.unit.hw.helpers import (
    H100_DEVICES,
    commands,
    context,
    fixture_facts,
    host,
    load_fixture,
    pinned,
    profile,
    run_role,
)

H100 = "h100-sxm-8x-nvswitch-cx7"


def netdevs(table, devs):  # type: ignore[no-untyped-def]
    found = table[rdma_facts.RdmaSysfsFact()]
    return {found[d].netdevs[0]: table[rdma_facts.NetdevFact(found[d].netdevs[0])] for d in devs}


def test_h100_eight_active_roce_ports_pass() -> None:
    assert check_devices(H100_DEVICES, load_fixture(H100)[rdma_facts.RdmaSysfsFact()]) == []


def test_missing_device_and_down_port_are_named() -> None:
    found = load_fixture("driver-mismatch")[rdma_facts.RdmaSysfsFact()]
    problems = check_devices(("mlx5_0", "mlx5_7", "mlx5_9"), found)
    assert problems == [
        "mlx5_7 port 1 is DOWN, not ACTIVE",
        "rdma_devices declares mlx5_9, but the host has no such RDMA device "
        "(found: mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, mlx5_6, mlx5_7)",
    ]


def test_infiniband_link_layer_is_an_error() -> None:
    port = rdma_facts.RdmaPort(1, "ACTIVE", "LinkUp", "InfiniBand")
    dev = rdma_facts.RdmaDevice("mlx5_0", ("ib0",), (port,))
    assert check_devices(("mlx5_0",), {"mlx5_0": dev}) == [
        "mlx5_0 port 1 link layer is InfiniBand, not Ethernet (RoCE)"
    ]


def test_gid_index_computed_from_sysfs() -> None:
    table = load_fixture(H100)
    found = table[rdma_facts.RdmaSysfsFact()]
    assert compute_gid_index(found, H100_DEVICES, netdevs(table, H100_DEVICES)) == 3


def test_gid_index_not_assumed_to_be_three() -> None:
    # a VLAN/IPv6 layout shifts the IPv4 RoCE v2 entry to index 5
    gids = (
        rdma_facts.Gid(0, "fe80:0000:0000:0000:0a88:66ff:fe10:0000", "IB/RoCE v1", "ens1np0"),
        rdma_facts.Gid(1, "fe80:0000:0000:0000:0a88:66ff:fe10:0000", "RoCE v2", "ens1np0"),
        rdma_facts.Gid(2, "fd00:0000:0000:0000:0000:0000:0000:0011", "IB/RoCE v1", "ens1np0"),
        rdma_facts.Gid(3, "fd00:0000:0000:0000:0000:0000:0000:0011", "RoCE v2", "ens1np0"),
        rdma_facts.Gid(4, "0000:0000:0000:0000:0000:ffff:0a0a:000b", "IB/RoCE v1", "ens1np0"),
        rdma_facts.Gid(5, "0000:0000:0000:0000:0000:ffff:0a0a:000b", "RoCE v2", "ens1np0"),
    )
    port = rdma_facts.RdmaPort(1, "ACTIVE", "LinkUp", "Ethernet", gids)
    dev = rdma_facts.RdmaDevice("mlx5_0", ("ens1np0",), (port,))
    nd = rdma_facts.NetdevInfo("ens1np0", True, 9000, "up", ("10.10.0.11",))
    assert compute_gid_index({"mlx5_0": dev}, ("mlx5_0",), {"ens1np0": nd}) == 5


def test_gid_index_configured_must_be_roce_v2() -> None:
    table = load_fixture(H100)
    found, nds = table[rdma_facts.RdmaSysfsFact()], netdevs(table, ("mlx5_0",))
    assert compute_gid_index(found, ("mlx5_0",), nds, 3) == 3
    with pytest.raises(RdmaError, match="2 on mlx5_0 port 1 is IB/RoCE v1"):
        compute_gid_index(found, ("mlx5_0",), nds, 2)


def test_no_ipv4_gid_is_an_error_naming_the_device() -> None:
    table = load_fixture(H100)
    found = table[rdma_facts.RdmaSysfsFact()]
    nds = {"ens1np0": dataclasses.replace(table[rdma_facts.NetdevFact("ens1np0")], ipv4=("10.99.0.1",))}
    with pytest.raises(RdmaError, match=r"mlx5_0 port 1 has no RoCE v2 GID .*ens1np0 \(10.99.0.1\)"):
        compute_gid_index(found, ("mlx5_0",), nds)


def test_ucx_net_devices() -> None:
    assert ucx_net_devices(("mlx5_0", "mlx5_1")) == "mlx5_0:1,mlx5_1:1"


def test_qos_mlnx_qos_when_present_and_converged_ports_untouched() -> None:
    table = load_fixture(H100)
    rdma = pinned().rdma
    assert qos_tool(table[rdma_facts.QosToolsFact()]) == "mlnx_qos"
    assert not qos_converged(table[rdma_facts.QosFact("ens1np0", "mlnx_qos")], rdma.pfc_priority, rdma.dscp)
    assert qos_commands("mlnx_qos", "ens1np0", rdma.pfc_priority, rdma.dscp) == (
        "mlnx_qos -i ens1np0 --trust dscp",
        "mlnx_qos -i ens1np0 --pfc 0,0,0,1,0,0,0,0",
        "mlnx_qos -i ens1np0 --dscp2prio set,26,3",
    )
    assert qos_converged(table[rdma_facts.QosFact("ens2np0", "mlnx_qos")], rdma.pfc_priority, rdma.dscp)


def test_qos_dcb_otherwise() -> None:
    table = load_fixture("driver-mismatch")
    rdma = pinned().rdma
    assert qos_tool(table[rdma_facts.QosToolsFact()]) == "dcb"
    assert not qos_converged(table[rdma_facts.QosFact("ens1np0", "dcb")], rdma.pfc_priority, rdma.dscp)
    assert qos_commands("dcb", "ens1np0", rdma.pfc_priority, rdma.dscp) == (
        "dcb pfc set dev ens1np0 prio-pfc all:off 3:on",
        "dcb app replace dev ens1np0 dscp-prio 26:3",
    )


def test_roce_script_sets_mode_mtu_qos_ecn() -> None:
    text = roce_script(("mlx5_0",), {"mlx5_0": "ens1np0"}, pinned().rdma, "mlnx_qos", True)
    assert "echo 'RoCE v2' > /sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_mode" in text
    assert "ip link set dev ens1np0 mtu 9000" in text
    assert "echo 1 > /sys/class/net/ens1np0/ecn/roce_np/enable/3" in text
    assert "mlnx_qos -i ens1np0 --trust dscp" in text


def test_role_on_h100_installs_stack_persists_and_reapplies_drift() -> None:
    ctx = context(pinned(), host())
    ops, skips, changes = run_role(role, ctx, fixture_facts(H100))
    cmds = commands(changes)
    for pkg in role.APT_PACKAGES:
        assert any(c.endswith(f" {pkg}") for c in cmds), pkg
    assert "modprobe rdma_ucm" in cmds
    assert "upload /usr/local/sbin/pdfleet-roce-setup" in cmds
    assert "upload /etc/modules-load.d/ib_uverbs.conf" in cmds
    drift = [c for c in changes if c.op == "RoCE settings"]
    # RoCE mode unset on every device, and mlx5_0's netdev still has default QoS
    assert drift and "ens1np0: trust dscp" in drift[0].diff and "ens2np0: trust" not in drift[0].diff
    assert "mlx5_0: RDMA-CM default mode unset → RoCE v2" in drift[0].diff
    assert skips == []


def test_role_errors_name_the_device() -> None:
    ctx = context(pinned(), host())
    with pytest.raises(HardwareError, match="gpu-01: mlx5_7 port 1 is DOWN, not ACTIVE"):
        list(role.operations(ctx, fixture_facts("driver-mismatch")))


def test_role_skips_when_rdma_disabled_or_nothing_declared() -> None:
    off = profile("cross-rdma", rdma={"enabled": False})
    _, skips, _ = run_role(role, context(off, host()), fixture_facts("lab-container"))
    assert [s.reason for s in skips] == ["rdma.enabled is false in the profile: KV moves over TCP"]
    _, skips, _ = run_role(role, context(pinned(), host(rdma_devices=())), fixture_facts("lab-container"))
    assert "declares no rdma_devices" in skips[0].reason


def test_role_does_not_apply_to_same_host_or_colocated() -> None:
    assert not role.applies(context(pinned("same-host-pcie"), host(groups=("prefill", "decode"))))
    assert not role.applies(context(pinned("colocated"), host(groups=("colocated",))))
    assert role.applies(context(pinned(), host(groups=("decode",))))


def test_role_applies_by_the_host_s_own_model_s_topology(tmp_path: Path) -> None:
    """A models: profile whose top level says colocated and whose P/D model is cross-host: that model's
    prefill and decode hosts get the role, the small colocated model's host does not."""
    path = tmp_path / "two.yml"
    path.write_text(
        "extends: lab-two-models\ntopology: colocated\nmodels:\n"
        "  - {name: llama-8b, aliases: [llama-3.1-8b], topology: cross-host}\n"
        "  - name: llama-1b\n    aliases: [llama-3.2-1b]\n    topology: colocated\n"
        "    model: {id: meta-llama/Llama-3.2-1B-Instruct, max_model_len: 16384}\n"
        "    pools: {prefill: null, decode: null,\n"
        "            colocated: {port: 8001, gpus: [1], hosts: [lab-colo2], max_num_batched_tokens: 4096}}\n"
    )
    d = deploy(str(path), REPO / "inventory/lab.yml", secrets=None)
    assert d.profile.topology == "colocated"
    hosts = d.inventory.hosts
    assert [role.applies(d.context(hosts[h])) for h in ("lab-p1", "lab-d1", "lab-colo2")] == [
        True,
        True,
        False,
    ]
