"""GPU driver decisions: from parsed facts and the profile's `gpu:` section to a plan or a skip reason.

Pure functions, no host access: the gpu_driver role turns a GpuPlan into operations, and the tests
check every branch against fixture facts (H100 HGX, L40S PCIe, Secure Boot on, driver drift, each
supported distribution). Repository and package names per distribution are `distro`'s decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pdfleet.hw.distro import (
    PlatformExtras,
    PlatformRefusal,
    check_branch,
    cuda_repo_url,
    driver_packages,
    fabric_manager_package,
    platform_extras,
    resolve_platform,
)
from pdfleet.hw.gpu_facts import (
    SB_ENABLED,
    DriverFact,
    DriverInfo,
    KernelFact,
    KernelInfo,
    MokEnrolledFact,
    NvidiaPci,
    NvidiaPciFact,
    SecureBootFact,
)
from pdfleet.hw.os_facts import OsRelease, OsReleaseFact
from pdfleet.ops.base import Fact, FactSource
from pdfleet.ops.kernel import LoadedModules

if TYPE_CHECKING:
    from pdfleet.model.profile import GpuSpec

# DMA-BUF import of GPU memory by RDMA drivers (ib_umem_dmabuf) landed in Linux 5.12; NVIDIA exports
# DMA-BUF only from the open kernel modules (reference/provisioning.md §1.4, §2.6).
DMABUF_MIN_KERNEL = (5, 12)
# CUDA 13 needs an R580+ driver; older branches get the CUDA 12 builds of NIXL/Mooncake.
CUDA13_MIN_BRANCH = 580
DKMS_MOK_CERT = "/var/lib/dkms/mok.pub"

GpuDirectMode = Literal["dmabuf", "peermem", "none"]


@dataclass(frozen=True)
class GpuFacts:
    """Every fact the GPU decisions read, gathered once."""

    pci: NvidiaPci
    driver: DriverInfo
    kernel: KernelInfo
    secure_boot: str
    modules: frozenset[str]  # loaded kernel modules (nouveau, nvidia_peermem), underscore spelling
    mok_enrolled: bool = False
    os: OsRelease = OsRelease()


# What gather_gpu_facts reads on every host (MOK enrollment only under Secure Boot, so not here).
GPU_FACTS: tuple[Fact[Any], ...] = (
    OsReleaseFact(),
    SecureBootFact(),
    NvidiaPciFact(),
    DriverFact(),
    KernelFact(),
    LoadedModules(),
)


def gather_gpu_facts(facts: FactSource) -> GpuFacts:
    """The GPU-related facts of one host (MOK enrollment only matters, and is read, under Secure Boot)."""
    secure_boot = facts.get(SecureBootFact())
    return GpuFacts(
        facts.get(NvidiaPciFact()),
        facts.get(DriverFact()),
        facts.get(KernelFact()),
        secure_boot,
        facts.get(LoadedModules()),
        facts.get(MokEnrolledFact(DKMS_MOK_CERT)) if secure_boot == SB_ENABLED else False,
        facts.get(OsReleaseFact()),
    )


@dataclass(frozen=True)
class PlanChoice:
    """Do it or not, and why (the reason is shown as a skip or in the plan)."""

    do: bool
    reason: str


@dataclass(frozen=True)
class GpuDirect:
    """The GPUDirect RDMA path for a host and why."""

    mode: GpuDirectMode
    reason: str


@dataclass(frozen=True)
class GpuPlan:
    """What the gpu_driver role does on one host."""

    skip: str | None = None  # the whole role skips (no NVIDIA GPU)
    error: str | None = None  # refuse to change anything (Secure Boot, unsupported platform or branch)
    platform: str = ""  # e.g. "Ubuntu 24.04"
    repo_url: str | None = None  # the driver repository to configure; None: the platform's own (DGX OS)
    branch: str = ""
    version_glob: str | None = None  # apt version glob for every driver package, e.g. "570.133.20-*"
    packages: tuple[str, ...] = ()
    headers_package: str | None = None  # installed when the running kernel's headers are missing
    fabric_manager: PlanChoice = PlanChoice(False, "")
    fabric_manager_package: str = ""  # pinned to the driver's exact version by the role
    extras: PlatformExtras = PlatformExtras((), False, "")
    gpudirect: GpuDirect = GpuDirect("none", "")
    persistence: PlanChoice = PlanChoice(False, "")
    reboot_reasons: tuple[str, ...] = ()
    driver_ready: bool = False  # the pinned driver is loaded now: services can start, modules load


def driver_branch(spec: GpuSpec) -> str:
    """The branch to install: the profile's, or the major of its pinned version."""
    if spec.driver_version:
        return str(spec.driver_version).split(".")[0]
    return str(spec.driver_branch)


def cuda_major(spec: GpuSpec) -> int:
    """The CUDA major the pinned driver serves best: 13 from R580 on, else 12."""
    branch = driver_branch(spec)
    return 13 if branch.isdigit() and int(branch) >= CUDA13_MIN_BRANCH else 12


def dmabuf_support(open_modules: bool, kernel: KernelInfo) -> PlanChoice:
    """Whether GPUDirect RDMA can use DMA-BUF: open kernel modules on Linux >= 5.12."""
    if not open_modules:
        return PlanChoice(False, "DMA-BUF needs the open NVIDIA kernel modules (gpu.open_modules: false)")
    if kernel.version < DMABUF_MIN_KERNEL:
        want = ".".join(map(str, DMABUF_MIN_KERNEL))
        return PlanChoice(False, f"DMA-BUF needs Linux >= {want}; running {kernel.release}")
    return PlanChoice(True, f"open kernel modules on Linux {kernel.release}")


def resolve_gpudirect(spec: GpuSpec, kernel: KernelInfo, has_rdma: bool) -> GpuDirect:
    """The GPUDirect RDMA path for `gpu.gpudirect`: DMA-BUF where supported, else nvidia-peermem.

    Raises ValueError when the profile demands DMA-BUF the host cannot do.
    """
    mode = spec.gpudirect
    if mode == "none":
        return GpuDirect("none", "gpu.gpudirect: none")
    if not has_rdma:
        return GpuDirect("none", "no RDMA devices on this host: GPUDirect RDMA has nothing to pair with")
    dmabuf = dmabuf_support(spec.open_modules, kernel)
    if mode == "dmabuf" and not dmabuf.do:
        raise ValueError(f"gpu.gpudirect: dmabuf is not possible here: {dmabuf.reason}")
    if mode == "peermem":
        return GpuDirect("peermem", "gpu.gpudirect: peermem")
    if dmabuf.do:
        return GpuDirect("dmabuf", f"DMA-BUF supported ({dmabuf.reason})")
    return GpuDirect("peermem", f"nvidia-peermem, since {dmabuf.reason}")


def decide_fabric_manager(spec: GpuSpec, pci: NvidiaPci) -> PlanChoice:
    """Fabric Manager only where NVSwitches exist (without it CUDA fails with error 802 there)."""
    want = spec.fabric_manager
    n = len(pci.nvswitches) or pci.nvswitch_proc_devices
    if want is False:
        if pci.has_nvswitch:
            return PlanChoice(
                False,
                f"gpu.fabric_manager: false, but {n} NVSwitch(es) present: CUDA will "
                "fail with error 802 until nvidia-fabricmanager runs",
            )
        return PlanChoice(False, "gpu.fabric_manager: false")
    if not pci.has_nvswitch:
        return PlanChoice(False, "no NVSwitch on the PCI bus: Fabric Manager only runs on NVSwitch systems")
    return PlanChoice(True, f"{n} NVSwitch(es) on the PCI bus")


def secure_boot_error(host: str, facts: GpuFacts, pinned_loaded: bool) -> str | None:
    """A refusal when Secure Boot would block the DKMS modules pdfleet is about to build."""
    if facts.secure_boot != SB_ENABLED or pinned_loaded or facts.mok_enrolled:
        return None
    return (
        f"{host}: Secure Boot is enabled, so the kernel refuses the NVIDIA modules DKMS would build unless "
        "they are signed with an enrolled Machine Owner Key; nothing was installed. Either disable Secure "
        "Boot in the firmware setup, or enroll the key DKMS signs with (created by dkms at "
        f"{DKMS_MOK_CERT}): `sudo mokutil --import {DKMS_MOK_CERT}`, set a one-time password, reboot, "
        "confirm the enrollment in the MOK manager on the console, then rerun provision."
    )


def pinned_loaded(spec: GpuSpec, driver: DriverInfo) -> bool:
    """The loaded driver is the pinned one (exact version, else the branch) in the chosen flavour."""
    if driver.loaded_version is None:
        return False
    if spec.driver_version:
        same = driver.loaded_version == spec.driver_version
    else:
        same = driver.loaded_version.split(".")[0] == driver_branch(spec)
    return same and (driver.loaded_open is None or driver.loaded_open == bool(spec.open_modules))


def plan_gpu(
    host: str, spec: GpuSpec, facts: GpuFacts, has_rdma: bool, cuda_repo: str | dict[str, str] | None = None
) -> GpuPlan:
    """The gpu_driver plan for one host: skip without GPUs, refuse an unsupported platform or branch or
    under Secure Boot, else what to do. `cuda_repo` is the profile's mirrors.cuda_repo."""
    if not facts.pci.gpus:
        return GpuPlan(skip="no NVIDIA GPU on the PCI bus")
    branch = driver_branch(spec)
    try:
        platform = resolve_platform(host, facts.os)
        check_branch(host, platform, branch)
        repo_url = cuda_repo_url(host, platform, facts.os.arch, cuda_repo)
        packages = driver_packages(host, platform, branch, bool(spec.open_modules))
    except PlatformRefusal as exc:
        return GpuPlan(error=str(exc))
    loaded_ok = pinned_loaded(spec, facts.driver)
    error = secure_boot_error(host, facts, loaded_ok)
    if error:
        return GpuPlan(error=error)
    try:
        gpudirect = resolve_gpudirect(spec, facts.kernel, has_rdma)
    except ValueError as exc:
        return GpuPlan(error=f"{host}: {exc}")
    reboots = []
    if not loaded_ok:
        have = facts.driver.loaded_version or "none"
        flavour = "open" if spec.open_modules else "proprietary"
        want = spec.driver_version or f"branch {branch}"
        reboots.append(f"NVIDIA driver loaded: {have}; pinned: {want} ({flavour} modules)")
    elif facts.driver.reboot_pending:
        reboots.append(
            f"installed NVIDIA module {facts.driver.installed_version} differs from the loaded "
            f"{facts.driver.loaded_version}"
        )
    if "nouveau" in facts.modules:
        reboots.append("nouveau is loaded; it is blacklisted and leaves at the next boot")
    persistence = PlanChoice(bool(spec.persistence), "gpu.persistence: " + str(spec.persistence).lower())
    return GpuPlan(
        platform=platform.name,
        repo_url=repo_url,
        branch=branch,
        version_glob=f"{spec.driver_version}-*" if spec.driver_version else None,
        packages=packages,
        headers_package=None if facts.kernel.headers_installed else facts.kernel.headers_package,
        fabric_manager=decide_fabric_manager(spec, facts.pci),
        fabric_manager_package=fabric_manager_package(platform, branch),
        extras=platform_extras(platform, facts.os.product_name),
        gpudirect=gpudirect,
        persistence=persistence,
        reboot_reasons=tuple(reboots),
        driver_ready=loaded_ok and not facts.driver.reboot_pending,
    )
