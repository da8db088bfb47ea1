"""gpu_driver decisions and operations against fixture hosts (H100 HGX, L40S, Secure Boot, drift, lab)."""

from __future__ import annotations

import pytest

import roles.gpu_driver as role
from pdfleet.hw import HardwareError, gpu_facts
from pdfleet.hw.gpu import dmabuf_support, gather_gpu_facts, plan_gpu, resolve_gpudirect
from pdfleet.ops.apt import AptRepo
from pdfleet.ops.base import REBOOT_REQUIRED
from tests.unit.hw.helpers import PIN, commands, context, fixture_facts, host, pinned, profile, run_role

H100 = "h100-sxm-8x-nvswitch-cx7"


def plan_for(fixture: str, prof=None, h=None):  # type: ignore[no-untyped-def]
    prof = prof or pinned()
    h = h or host()
    from pdfleet.hw.kv import uses_rdma

    return plan_gpu(h.name, prof.gpu, gather_gpu_facts(fixture_facts(fixture)), uses_rdma(prof, h))


def test_h100_converged_driver_fabric_manager_dmabuf_no_reboot() -> None:
    plan = plan_for(H100)
    assert plan.skip is None and plan.error is None
    assert plan.packages == ("nvidia-kernel-open-570", "cuda-drivers-570")
    assert plan.version_glob == f"{PIN}-*"
    assert plan.fabric_manager.do and "4 NVSwitch" in plan.fabric_manager.reason
    assert plan.fabric_manager_package == "nvidia-fabricmanager-570"
    assert plan.gpudirect.mode == "dmabuf"
    assert plan.headers_package is None and plan.reboot_reasons == () and plan.driver_ready


def test_l40s_no_fabric_manager_no_rdma_headers_missing_nouveau_needs_reboot() -> None:
    same = pinned("same-host-pcie")
    plan = plan_for("l40s-pcie-2x", same, host(gpus=(0, 1), rdma_devices=(), rdma_netdev=None))
    assert not plan.fabric_manager.do and "no NVSwitch" in plan.fabric_manager.reason
    assert plan.gpudirect.mode == "none" and "no RDMA devices" in plan.gpudirect.reason
    assert plan.headers_package == "linux-headers-6.1.0-31-amd64"
    assert any("nouveau" in r for r in plan.reboot_reasons)


def test_secure_boot_on_refuses_with_remedy_and_installs_nothing() -> None:
    prof = pinned("same-host-pcie")
    h = host("sb-01", gpus=(0, 1), rdma_devices=(), rdma_netdev=None)
    plan = plan_for("secure-boot-on", prof, h)
    assert plan.error and "Secure Boot is enabled" in plan.error and "mokutil --import" in plan.error
    assert plan.error.startswith("sb-01:")
    with pytest.raises(HardwareError, match="Secure Boot"):
        list(role.operations(context(prof, h), fixture_facts("secure-boot-on")))


def test_secure_boot_on_with_enrolled_dkms_key_proceeds() -> None:
    prof = pinned("same-host-pcie")
    h = host(gpus=(0, 1), rdma_devices=(), rdma_netdev=None)
    facts = fixture_facts("secure-boot-on", {gpu_facts.MokEnrolledFact(): True})
    ops, skips, changes = run_role(role, context(prof, h), facts)
    assert any("cuda-drivers-570" in c for c in commands(changes))


def test_driver_differs_from_pin_upgrades_and_reports_reboot() -> None:
    prof = pinned()
    ctx = context(prof, host())
    ops, skips, changes = run_role(role, ctx, fixture_facts("driver-mismatch"))
    cmds = commands(changes)
    assert any(f"cuda-drivers-570={PIN}-*" in c for c in cmds)
    assert any(f"nvidia-kernel-open-570={PIN}-*" in c for c in cmds)
    assert "apt-mark hold cuda-drivers-570" in cmds and "apt-mark hold nvidia-fabricmanager-570" in cmds
    reboot = [s for s in skips if s.what == REBOOT_REQUIRED]
    assert reboot and "550.127.05" in reboot[0].reason and PIN in reboot[0].reason
    # services are enabled but not started until the new driver is loaded
    fm = [op for op in ops if getattr(op, "unit", "") == "nvidia-fabricmanager.service"]
    assert fm and fm[0].enabled and fm[0].running is None
    assert not any(c.startswith("systemctl start") or c.startswith("modprobe") for c in cmds)


def test_h100_fresh_os_plans_repo_pin_blacklist_fm_persistenced() -> None:
    ctx = context(pinned(), host())
    ops, skips, changes = run_role(role, ctx, fixture_facts(H100))
    cmds = commands(changes)
    assert "upload /etc/apt/sources.list.d/cuda.list" in cmds
    assert "upload /etc/modprobe.d/blacklist-nouveau.conf" in cmds
    assert "upload /etc/apt/preferences.d/pdfleet-nvidia" in cmds
    assert "upload /etc/apt/apt.conf.d/51pdfleet-nvidia-no-unattended" in cmds
    units = {op.unit: op.running for op in ops if hasattr(op, "unit") and hasattr(op, "running")}
    assert units == {"nvidia-fabricmanager.service": True, "nvidia-persistenced.service": True}
    assert any(s.what == "nvidia-peermem" and "dmabuf" in s.reason for s in skips)
    assert not any(s.what == REBOOT_REQUIRED for s in skips)
    nouveau = [c for c in changes if "blacklist-nouveau" in c.diff or "blacklist-nouveau" in str(c.commands)]
    assert nouveau and any(h.name == "update-initramfs" for c in nouveau for h in c.notify)


def test_cuda_repo_follows_the_mirror() -> None:
    prof = profile(
        "cross-rdma",
        gpu={"driver_branch": "570"},
        mirrors={"cuda_repo": "http://198.18.0.1:8081/cuda", "apt_trusted": True},
    )
    ops, _, _ = run_role(role, context(prof, host()), fixture_facts(H100))
    repo = next(op for op in ops if isinstance(op, AptRepo))
    assert repo.source_line() == "deb [trusted=yes] http://198.18.0.1:8081/cuda/ /\n"
    ops, _, _ = run_role(role, context(pinned(), host()), fixture_facts(H100))
    public = next(op for op in ops if isinstance(op, AptRepo))
    assert public.uri == "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/"
    assert public.key_url == public.uri + "3bf863cc.pub"


def test_lab_host_skips_with_reason() -> None:
    ctx = context(pinned("cross-rdma"), host(rdma_devices=(), rdma_netdev=None))
    ops, skips, changes = run_role(role, ctx, fixture_facts("lab-container"))
    assert ops == [] and [(s.what, s.reason) for s in skips] == [
        ("NVIDIA driver", "no NVIDIA GPU on the PCI bus")
    ]


def test_proprietary_flavour_and_peermem_fallback() -> None:
    prof = pinned(open_modules=False)
    assert plan_for(H100, prof).packages == ("cuda-drivers-570",)
    kernel = gpu_facts.KernelInfo("6.1.0-31-amd64", True)
    assert not dmabuf_support(False, kernel).do
    assert resolve_gpudirect(prof.gpu, kernel, True).mode == "peermem"
    old = gpu_facts.KernelInfo("5.10.0-28-amd64", True)
    assert resolve_gpudirect(pinned().gpu, old, True).mode == "peermem"
    with pytest.raises(ValueError, match="5.12"):
        resolve_gpudirect(pinned(gpudirect="dmabuf").gpu, old, True)


def test_peermem_mode_loads_and_persists_module_when_driver_ready() -> None:
    prof = pinned(gpudirect="peermem")
    ops, skips, changes = run_role(role, context(prof, host()), fixture_facts(H100))
    cmds = commands(changes)
    assert "modprobe nvidia-peermem" in cmds and "upload /etc/modules-load.d/nvidia-peermem.conf" in cmds


def test_fabric_manager_forced_off_on_nvswitch_warns_about_error_802() -> None:
    plan = plan_for(H100, pinned(fabric_manager=False))
    assert not plan.fabric_manager.do and "802" in plan.fabric_manager.reason


def test_branch_pin_without_exact_version_accepts_any_build_of_the_branch() -> None:
    prof = profile("cross-rdma", gpu={"driver_branch": "570"})
    plan = plan_for(H100, prof)
    assert plan.version_glob is None and plan.reboot_reasons == ()
    assert plan_for(H100, profile("cross-rdma")).reboot_reasons  # the shipped 580 pin is not loaded
