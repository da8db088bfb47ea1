"""Kernel modules: /proc/modules on real outputs and hardware fixtures, KernelModule plans."""

from __future__ import annotations

from pdfleet.ops.base import FakeFacts
from pdfleet.ops.files import FileState
from pdfleet.ops.kernel import KernelModule, LoadedModules, parse_proc_modules
from tests.unit.hw.helpers import load_fixture
from tests.unit.ops.helpers import commands, file_info

PROC_MODULES = """nvidia_uvm 1540096 0 - Live 0x0000000000000000 (POE)
nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)
nvidia 62738432 3 nvidia_uvm,nvidia_peermem, Live 0x0000000000000000 (POE)
ib_core 458752 8 rdma_ucm,ib_uverbs,nvidia_peermem, Live 0x0000000000000000
br_netfilter 32768 0 - Live 0x0000000000000000
"""


def test_proc_modules() -> None:
    assert parse_proc_modules(PROC_MODULES) == frozenset(
        {"nvidia_uvm", "nvidia_peermem", "nvidia", "ib_core", "br_netfilter"}
    )


def test_loaded_modules_name_peermem_and_nouveau() -> None:
    assert "nvidia_peermem" in load_fixture("driver-mismatch")[LoadedModules()]
    assert "nouveau" in load_fixture("l40s-pcie-2x")[LoadedModules()]
    assert load_fixture("lab-container")[LoadedModules()] == frozenset()


def test_kernel_module_loaded_and_persisted() -> None:
    op = KernelModule("nvidia-peermem")
    persisted = "/etc/modules-load.d/nvidia-peermem.conf"
    converged = FakeFacts(
        {LoadedModules(): frozenset({"nvidia_peermem"}), FileState(persisted): file_info("nvidia-peermem\n")}
    )
    assert op.plan(converged) == []
    fresh = FakeFacts({LoadedModules(): frozenset(), FileState(persisted): None})
    assert commands(op.plan(fresh)) == [
        "modprobe nvidia-peermem",
        (persisted, "0644", "root", "root", b"nvidia-peermem\n"),
    ]


def test_kernel_module_options_are_written_for_the_next_load() -> None:
    op = KernelModule("nvidia", options="NVreg_EnableStreamMemOPs=1", persist=False)
    conf = "/etc/modprobe.d/pdfleet-nvidia.conf"
    changes = op.plan(FakeFacts({LoadedModules(): frozenset({"nvidia"}), FileState(conf): None}))
    # already loaded: the options apply at its next load, nothing reloads it now
    body = b"options nvidia NVreg_EnableStreamMemOPs=1\n"
    assert commands(changes) == [(conf, "0644", "root", "root", body)]
    assert changes[0].op == "kernel module nvidia"


def test_kernel_module_absent_and_blacklisted() -> None:
    op = KernelModule("nouveau", present=False, blacklist=True)
    bl = "/etc/modprobe.d/blacklist-pdfleet-nouveau.conf"
    facts = FakeFacts(
        {
            LoadedModules(): frozenset({"nouveau"}),
            FileState("/etc/modules-load.d/nouveau.conf"): None,
            FileState(bl): None,
        }
    )
    assert commands(op.plan(facts)) == [
        "modprobe -r nouveau",
        (bl, "0644", "root", "root", b"blacklist nouveau\n"),
    ]


def test_kernel_module_absent_removes_its_boot_load_file() -> None:
    persisted = "/etc/modules-load.d/nvidia-peermem.conf"
    facts = FakeFacts({LoadedModules(): frozenset(), FileState(persisted): file_info("nvidia-peermem\n")})
    assert commands(KernelModule("nvidia-peermem", present=False).plan(facts)) == [f"rm -f {persisted}"]
