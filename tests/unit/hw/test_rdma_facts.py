"""RDMA host fact parsers (sysfs, netdev, QoS) against fixture outputs whose formats come
from the tools' documentation."""

from __future__ import annotations

from pdfleet.hw import rdma_facts
from tests.unit.hw.helpers import load_fixture


def test_rdma_sysfs_ports_gids_and_netdevs() -> None:
    devs = load_fixture("h100-sxm-8x-nvswitch-cx7")[rdma_facts.RdmaSysfsFact()]
    assert sorted(devs) == [f"mlx5_{i}" for i in range(8)]
    port = devs["mlx5_3"].port(1)
    assert port is not None and (port.state, port.phys_state, port.link_layer) == (
        "ACTIVE",
        "LinkUp",
        "Ethernet",
    )
    assert devs["mlx5_3"].netdevs == ("ens4np0",)
    # zero GIDs (unpopulated table entries) are dropped; v1 and v2 entries per address
    assert [(g.index, g.type) for g in port.gids] == [
        (0, "IB/RoCE v1"),
        (1, "RoCE v2"),
        (2, "IB/RoCE v1"),
        (3, "RoCE v2"),
    ]
    assert port.gids[3].ipv4 == "10.10.3.11" and port.gids[1].ipv4 is None


def test_rdma_port_down() -> None:
    devs = load_fixture("driver-mismatch")[rdma_facts.RdmaSysfsFact()]
    assert devs["mlx5_7"].port(1).state == "DOWN"  # type: ignore[union-attr]


def test_rdma_roce_mode_from_configfs() -> None:
    out = (
        "== ports\nmlx5_0/ports/1/state:4: ACTIVE\n== netdevs\nmlx5_0 ens1np0 \n== roce_mode\n"
        "/sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_mode:RoCE v2\n"
    )
    assert rdma_facts.parse_rdma_sysfs(out)["mlx5_0"].port(1).default_roce_mode == "RoCE v2"  # type: ignore[union-attr]


def test_netdev_mtu_addresses_ecn() -> None:
    nd = load_fixture("h100-sxm-8x-nvswitch-cx7")[rdma_facts.NetdevFact("ens1np0")]
    assert (nd.exists, nd.mtu, nd.ipv4) == (True, 9000, ("10.10.0.11",))
    assert nd.ecn_np[3] and nd.ecn_rp[3] and not nd.ecn_np[0]


def test_missing_netdev() -> None:
    assert not rdma_facts.parse_netdev("nope", "== mtu\n== operstate\n== addr\n== ecn\n").exists


def test_mlnx_qos_parse() -> None:
    table = load_fixture("h100-sxm-8x-nvswitch-cx7")
    good = table[rdma_facts.QosFact("ens2np0", "mlnx_qos")]
    assert good.trust == "dscp" and good.pfc_only(3) and good.dscp2prio[26] == 3
    default = table[rdma_facts.QosFact("ens1np0", "mlnx_qos")]
    assert default.trust == "pcp" and not default.pfc_only(3)


def test_dcb_parse() -> None:
    st = rdma_facts.parse_dcb(
        "pfc-cap 8 macsec-bypass off delay 0\nprio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n"
        "dscp-prio 26:3\n"
    )
    assert st.trust == "dscp" and st.pfc_only(3) and st.dscp2prio == {26: 3}
    off = load_fixture("driver-mismatch")[rdma_facts.QosFact("ens1np0", "dcb")]
    assert off.trust is None and off.pfc == (False,) * 8
