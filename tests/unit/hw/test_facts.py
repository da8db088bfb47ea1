"""Hardware fact parsers against fixture outputs whose formats come from the tools' documentation."""

from __future__ import annotations

import pytest

from pdfleet.hw import facts as hw
from tests.unit.hw.helpers import FIXTURES, PIN, load_fixture

ALL = sorted(p.stem for p in FIXTURES.glob("*.yml"))


@pytest.mark.parametrize("name", ALL)
def test_every_fixture_fact_names_its_format_source_and_parses(name: str) -> None:
    table = load_fixture(name)
    assert hw.NvidiaPciFact() in table and hw.DriverFact() in table and hw.KernelFact() in table


def test_h100_hgx_has_eight_gpus_and_four_nvswitches() -> None:
    pci = load_fixture("h100-sxm-8x-nvswitch-cx7")[hw.NvidiaPciFact()]
    assert len(pci.gpus) == 8 and len(pci.nvswitches) == 4 and pci.has_nvswitch
    assert pci.gpus[0] == hw.PciDevice(
        "0000:18:00.0", "0302", "10de", "2330", "NVIDIA Corporation GH100[H100 SXM5 80GB]"
    )


def test_l40s_has_two_gpus_and_no_nvswitch() -> None:
    pci = load_fixture("l40s-pcie-2x")[hw.NvidiaPciFact()]
    assert [g.device for g in pci.gpus] == ["26b9", "26b9"] and not pci.has_nvswitch


def test_sysfs_fallback_when_lspci_is_missing() -> None:
    out = (
        "== lspci\n== sysfs\n0000:41:00.0 0x10de 0x26b9 0x030200\n"
        "0000:42:00.1 0x10de 0x22ba 0x040300\n== nvswitch\n"
    )
    pci = hw.parse_nvidia_pci(out)
    assert [g.bdf for g in pci.gpus] == ["0000:41:00.0"]  # the audio function is not a GPU


def test_nvswitch_seen_through_proc_when_lspci_has_no_bridge() -> None:
    pci = hw.parse_nvidia_pci("== lspci\n== sysfs\n== nvswitch\n0\n1\n")
    assert pci.has_nvswitch and pci.nvswitch_proc_devices == 2


def test_driver_open_loaded_matches_installed() -> None:
    drv = load_fixture("h100-sxm-8x-nvswitch-cx7")[hw.DriverFact()]
    assert (drv.loaded_version, drv.loaded_open, drv.installed_open, drv.reboot_pending) == (
        PIN,
        True,
        True,
        False,
    )


def test_driver_proprietary_banner() -> None:
    drv = load_fixture("driver-mismatch")[hw.DriverFact()]
    assert drv.loaded_version == "550.127.05" and drv.loaded_open is False and drv.installed_open is False


def test_driver_absent() -> None:
    drv = load_fixture("lab-container")[hw.DriverFact()]
    assert drv == hw.DriverInfo()


def test_installed_module_newer_than_loaded_means_reboot_pending() -> None:
    drv = hw.parse_driver(
        "== proc\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (x)  d\n"
        f"== version\n{PIN}\n== license\nDual MIT/GPL\n"
    )
    assert drv.reboot_pending


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("SecureBoot enabled\n", hw.SB_ENABLED),
        ("SecureBoot disabled\n", hw.SB_DISABLED),
        ("EFI variables are not supported on this system\n", hw.SB_UNSUPPORTED),
        ("This system doesn't support Secure Boot\n", hw.SB_UNSUPPORTED),
        ("efivar 1\n", hw.SB_ENABLED),
        ("efivar 0\n", hw.SB_DISABLED),
        ("no-efi\n", hw.SB_UNSUPPORTED),
        ("unknown\n", hw.SB_UNKNOWN),
    ],
)
def test_secure_boot_states(text: str, state: str) -> None:
    assert hw.parse_secure_boot(text) == state


def test_kernel_and_headers() -> None:
    k = load_fixture("l40s-pcie-2x")[hw.KernelFact()]
    assert (
        k.version == (6, 1)
        and not k.headers_installed
        and k.headers_package == "linux-headers-6.1.0-31-amd64"
    )


def test_rdma_sysfs_ports_gids_and_netdevs() -> None:
    devs = load_fixture("h100-sxm-8x-nvswitch-cx7")[hw.RdmaSysfsFact()]
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
    devs = load_fixture("driver-mismatch")[hw.RdmaSysfsFact()]
    assert devs["mlx5_7"].port(1).state == "DOWN"  # type: ignore[union-attr]


def test_rdma_roce_mode_from_configfs() -> None:
    out = (
        "== ports\nmlx5_0/ports/1/state:4: ACTIVE\n== netdevs\nmlx5_0 ens1np0 \n== roce_mode\n"
        "/sys/kernel/config/rdma_cm/mlx5_0/ports/1/default_roce_mode:RoCE v2\n"
    )
    assert hw.parse_rdma_sysfs(out)["mlx5_0"].port(1).default_roce_mode == "RoCE v2"  # type: ignore[union-attr]


def test_ibv_devinfo() -> None:
    text = (
        "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.39.1002\n"
        "\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
        "\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tactive_mtu:\t\t4096 (5)\n\t\t\tlink_layer:\t\tEthernet\n\n"
        "hca_id:\tmlx5_1\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tactive_mtu:\t\t1024 (3)\n"
        "\t\t\tlink_layer:\t\tEthernet\n"
    )
    ports = hw.parse_ibv_devinfo(text)
    assert ports["mlx5_0"] == (hw.IbvPort(1, "PORT_ACTIVE", 4096, "Ethernet"),)
    assert ports["mlx5_1"][0].state == "PORT_DOWN"


def test_netdev_mtu_addresses_ecn() -> None:
    nd = load_fixture("h100-sxm-8x-nvswitch-cx7")[hw.NetdevFact("ens1np0")]
    assert (nd.exists, nd.mtu, nd.ipv4) == (True, 9000, ("10.10.0.11",))
    assert nd.ecn_np[3] and nd.ecn_rp[3] and not nd.ecn_np[0]


def test_missing_netdev() -> None:
    assert not hw.parse_netdev("nope", "== mtu\n== operstate\n== addr\n== ecn\n").exists


def test_mlnx_qos_parse() -> None:
    table = load_fixture("h100-sxm-8x-nvswitch-cx7")
    good = table[hw.QosFact("ens2np0", "mlnx_qos")]
    assert good.trust == "dscp" and good.pfc_only(3) and good.dscp2prio[26] == 3
    default = table[hw.QosFact("ens1np0", "mlnx_qos")]
    assert default.trust == "pcp" and not default.pfc_only(3)


def test_dcb_parse() -> None:
    st = hw.parse_dcb(
        "pfc-cap 8 macsec-bypass off delay 0\nprio-pfc 0:off 1:off 2:off 3:on 4:off 5:off 6:off 7:off\n"
        "dscp-prio 26:3\n"
    )
    assert st.trust == "dscp" and st.pfc_only(3) and st.dscp2prio == {26: 3}
    off = load_fixture("driver-mismatch")[hw.QosFact("ens1np0", "dcb")]
    assert off.trust is None and off.pfc == (False,) * 8


def test_nvidia_smi_rows() -> None:
    rows = load_fixture("h100-sxm-8x-nvswitch-cx7")[hw.NvidiaSmiFact()]
    assert len(rows) == 8 and rows[0].driver_version == PIN and rows[0].persistence_mode == "Enabled"
    assert load_fixture("lab-container")[hw.NvidiaSmiFact()] is None
