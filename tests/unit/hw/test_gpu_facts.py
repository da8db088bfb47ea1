"""GPU host fact parsers against fixture outputs whose formats come from the tools' documentation."""

from __future__ import annotations

import pytest

from pdfleet.hw import gpu_facts
from pdfleet.hw.os_facts import OsReleaseFact
from tests.unit.hw.helpers import FIXTURES, PIN, load_fixture

ALL = sorted(p.stem for p in FIXTURES.glob("*.yml"))
# OS-only fixtures (a distribution's facts), paired with a hardware fixture by test_distro
OS_ONLY = ("debian-12", "dgx-os-6", "dgx-os-7", "rocky-9", "ubuntu-22.04", "ubuntu-24.04")


@pytest.mark.parametrize("name", ALL)
def test_every_fixture_fact_names_its_format_source_and_parses(name: str) -> None:
    table = load_fixture(name)
    assert OsReleaseFact() in table
    if name not in OS_ONLY:
        assert {gpu_facts.NvidiaPciFact(), gpu_facts.DriverFact(), gpu_facts.KernelFact()} <= set(table)


def test_h100_hgx_has_eight_gpus_and_four_nvswitches() -> None:
    pci = load_fixture("h100-sxm-8x-nvswitch-cx7")[gpu_facts.NvidiaPciFact()]
    assert len(pci.gpus) == 8 and len(pci.nvswitches) == 4 and pci.has_nvswitch
    assert pci.gpus[0] == gpu_facts.PciDevice(
        "0000:18:00.0", "0302", "10de", "2330", "NVIDIA Corporation GH100[H100 SXM5 80GB]"
    )


def test_l40s_has_two_gpus_and_no_nvswitch() -> None:
    pci = load_fixture("l40s-pcie-2x")[gpu_facts.NvidiaPciFact()]
    assert [g.device for g in pci.gpus] == ["26b9", "26b9"] and not pci.has_nvswitch


def test_sysfs_fallback_when_lspci_is_missing() -> None:
    out = (
        "== lspci\n== sysfs\n0000:41:00.0 0x10de 0x26b9 0x030200\n"
        "0000:42:00.1 0x10de 0x22ba 0x040300\n== nvswitch\n"
    )
    pci = gpu_facts.parse_nvidia_pci(out)
    assert [g.bdf for g in pci.gpus] == ["0000:41:00.0"]  # the audio function is not a GPU


def test_nvswitch_seen_through_proc_when_lspci_has_no_bridge() -> None:
    pci = gpu_facts.parse_nvidia_pci("== lspci\n== sysfs\n== nvswitch\n0\n1\n")
    assert pci.has_nvswitch and pci.nvswitch_proc_devices == 2


def test_driver_open_loaded_matches_installed() -> None:
    drv = load_fixture("h100-sxm-8x-nvswitch-cx7")[gpu_facts.DriverFact()]
    assert (drv.loaded_version, drv.loaded_open, drv.installed_open, drv.reboot_pending) == (
        PIN,
        True,
        True,
        False,
    )


def test_driver_proprietary_banner() -> None:
    drv = load_fixture("driver-mismatch")[gpu_facts.DriverFact()]
    assert drv.loaded_version == "550.127.05" and drv.loaded_open is False and drv.installed_open is False


def test_driver_absent() -> None:
    drv = load_fixture("lab-container")[gpu_facts.DriverFact()]
    assert drv == gpu_facts.DriverInfo()


def test_installed_module_newer_than_loaded_means_reboot_pending() -> None:
    drv = gpu_facts.parse_driver(
        "== proc\nNVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (x)  d\n"
        f"== version\n{PIN}\n== license\nDual MIT/GPL\n"
    )
    assert drv.reboot_pending


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("SecureBoot enabled\n", gpu_facts.SB_ENABLED),
        ("SecureBoot disabled\n", gpu_facts.SB_DISABLED),
        ("EFI variables are not supported on this system\n", gpu_facts.SB_UNSUPPORTED),
        ("This system doesn't support Secure Boot\n", gpu_facts.SB_UNSUPPORTED),
        ("efivar 1\n", gpu_facts.SB_ENABLED),
        ("efivar 0\n", gpu_facts.SB_DISABLED),
        ("no-efi\n", gpu_facts.SB_UNSUPPORTED),
        ("unknown\n", gpu_facts.SB_UNKNOWN),
    ],
)
def test_secure_boot_states(text: str, state: str) -> None:
    assert gpu_facts.parse_secure_boot(text) == state


def test_kernel_and_headers() -> None:
    k = load_fixture("l40s-pcie-2x")[gpu_facts.KernelFact()]
    assert (
        k.version == (6, 1)
        and not k.headers_installed
        and k.headers_package == "linux-headers-6.1.0-31-amd64"
    )


def test_nvidia_smi_rows() -> None:
    rows = load_fixture("h100-sxm-8x-nvswitch-cx7")[gpu_facts.NvidiaSmiFact()]
    assert len(rows) == 8 and rows[0].driver_version == PIN and rows[0].persistence_mode == "Enabled"
    assert load_fixture("lab-container")[gpu_facts.NvidiaSmiFact()] is None
