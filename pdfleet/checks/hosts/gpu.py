"""GPU checks: pinned driver loaded, GPU count, persistence, Fabric Manager, GPUDirect path."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.checks.verify import VerifyPlugin, remote_fact
from pdfleet.hw.gpu import driver_branch, pinned_loaded, resolve_gpudirect
from pdfleet.hw.gpu_facts import DriverFact, KernelFact, NvidiaPci, NvidiaPciFact, NvidiaSmiFact
from pdfleet.hw.kv import uses_rdma
from pdfleet.model.inventory import Host
from pdfleet.ops.kernel import LoadedModules


def gpu_host(verify: VerifyPlugin, pd_host: Host, target: Any) -> NvidiaPci:
    """The host's NVIDIA PCI devices; skips when it runs no pool or has no NVIDIA GPU."""
    if not verify.topology.on_host(pd_host.name):
        pytest.skip("runs no vLLM pool")
    pci = remote_fact(target, NvidiaPciFact())
    if not pci.gpus:
        engine = verify.profile.vllm.engine
        pytest.skip("no NVIDIA GPU on the PCI bus" + (" (engine: sim)" if engine == "sim" else ""))
    return pci


def test_driver_version_matches_pin(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    gpu_host(verify, pd_host, target)
    spec = verify.profile.gpu
    drv = remote_fact(target, DriverFact())
    assert drv.loaded_version, "no NVIDIA kernel module loaded (/proc/driver/nvidia/version missing)"
    # the same test provision uses to decide whether the driver is converged
    flavour = {True: "open", False: "proprietary", None: "unknown flavour"}[drv.loaded_open]
    want = spec.driver_version or f"branch {driver_branch(spec)}"
    assert pinned_loaded(spec, drv), (
        f"loaded {drv.loaded_version} ({flavour}), pinned {want} "
        f"({'open' if spec.open_modules else 'proprietary'} modules)"
    )
    assert not drv.reboot_pending, f"installed {drv.installed_version} is not loaded yet: reboot"


def test_gpu_count_matches_inventory(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    pci = gpu_host(verify, pd_host, target)
    rows = remote_fact(target, NvidiaSmiFact())
    assert rows is not None, "nvidia-smi failed (driver not loaded or not installed)"
    assert len(rows) == len(pd_host.gpus), (
        f"nvidia-smi sees {len(rows)} GPUs, inventory declares {len(pd_host.gpus)}"
    )
    assert len(pci.gpus) >= len(pd_host.gpus)


def test_persistence_on(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    gpu_host(verify, pd_host, target)
    if not verify.profile.gpu.persistence:
        pytest.skip("gpu.persistence: false")
    svc = target.service("nvidia-persistenced")
    assert svc.is_enabled and svc.is_running, "nvidia-persistenced is not enabled and running"
    rows = remote_fact(target, NvidiaSmiFact()) or ()
    off = [r.index for r in rows if r.persistence_mode != "Enabled"]
    assert not off, f"persistence mode off on GPU(s) {off}"


def test_fabricmanager_active_on_nvswitch(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    pci = gpu_host(verify, pd_host, target)
    if not pci.has_nvswitch:
        pytest.skip("no NVSwitch on the PCI bus")
    if verify.profile.gpu.fabric_manager is False:
        pytest.skip("gpu.fabric_manager: false")
    svc = target.service("nvidia-fabricmanager")
    assert svc.is_enabled and svc.is_running, "nvidia-fabricmanager is not enabled and running"


def test_gpudirect_path(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    gpu_host(verify, pd_host, target)
    kernel = remote_fact(target, KernelFact())
    mode = resolve_gpudirect(verify.profile.gpu, kernel, uses_rdma(verify.kv_profile(pd_host), pd_host))
    if mode.mode == "none":
        pytest.skip(f"GPUDirect RDMA not used: {mode.reason}")
    if mode.mode == "peermem":
        assert "nvidia_peermem" in remote_fact(target, LoadedModules()), "nvidia_peermem is not loaded"
    else:
        assert remote_fact(target, DriverFact()).loaded_open, "DMA-BUF needs the open kernel module loaded"
