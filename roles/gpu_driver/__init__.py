"""gpu_driver: NVIDIA's CUDA apt repo for the host's distribution, the pinned and held driver branch, nouveau
off, headers for the running kernel, Fabric Manager on NVSwitch systems (IMEX/NVLink5 where the platform
needs them), persistence daemon, GPUDirect (DMA-BUF or peermem).

Hardware first: a host without an NVIDIA GPU on the PCI bus skips with that reason; an unsupported
distribution, a branch its repository lacks, or Secure Boot with modules DKMS cannot sign refuses before
anything is installed. Repository and package names per distribution: pdfleet.hw.distro. A change that
only takes effect after a reboot yields a `reboot required` marker (pdfleet.ops.base.REBOOT_REQUIRED)
with the reasons.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext
from pdfleet.hw import HardwareError
from pdfleet.hw.distro import CUDA_KEY, CUDA_SOURCE, missing_packages
from pdfleet.hw.gpu import GPU_FACTS, GpuPlan, gather_gpu_facts, plan_gpu
from pdfleet.hw.kv import uses_rdma
from pdfleet.ops.apt import AptPackage, AptPolicy, AptRepo
from pdfleet.ops.base import REBOOT_REQUIRED, Fact, FactSource, Handler, Operation, Run, Skip
from pdfleet.ops.files import File, FileContent
from pdfleet.ops.kernel import KernelModule
from pdfleet.ops.systemd import Service

NAME = "gpu_driver"
# Branch-specific packages (cuda-drivers-B, nvidia-fabricmanager-B, ...) come from NVIDIA's repository for
# the host's distribution (or its mirror), not the site's Debian/Ubuntu mirror.
APT_PACKAGES: tuple[str, ...] = ("dkms",)
NOUVEAU_CONF = "/etc/modprobe.d/blacklist-nouveau.conf"
APT_PIN = "/etc/apt/preferences.d/pdfleet-nvidia"
UNATTENDED_BLACKLIST = "/etc/apt/apt.conf.d/51pdfleet-nvidia-no-unattended"
UPDATE_INITRAMFS = Handler("update-initramfs", (Run("update-initramfs -u"),))


def applies(ctx: RoleContext) -> bool:
    """Every host running a vLLM pool; the hardware check decides what actually happens."""
    return bool(ctx.instances)


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    """The GPU facts, and the CUDA repository line already there (whether apt-cache policy can be asked)."""
    return (*GPU_FACTS, FileContent(CUDA_SOURCE))


def files(ctx: RoleContext) -> list[RenderedFile]:
    return []  # what it writes depends on the host's GPUs and kernel (facts)


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return []


def apt_pin(version_glob: str) -> str:
    """apt_preferences(5) pin holding every NVIDIA driver package at the pinned version.

    Pinning `cuda-drivers-B` alone does not pin its sub-packages, hence the globs."""
    return (
        "# Written by pdfleet (gpu_driver): the profile's gpu.driver_version.\n"
        "Package: nvidia-* libnvidia-* cuda-drivers* libcuda* libxnvctrl*\n"
        f"Pin: version {version_glob}\n"
        "Pin-Priority: 1001\n"
    )


def unattended_blacklist() -> str:
    """Keep unattended-upgrades away from the driver (its upgrades cause NVML version mismatches)."""
    return (
        "// Written by pdfleet (gpu_driver): driver upgrades only through provision.\n"
        'Unattended-Upgrade::Package-Blacklist { "nvidia-"; "libnvidia-"; "cuda-"; "libcuda"; };\n'
    )


def cuda_repo(ctx: RoleContext, uri: str) -> AptRepo:
    """NVIDIA's CUDA apt repository for the host's distribution (a flat repo), or the profile's mirror."""
    if ctx.profile.mirrors.apt_trusted:
        return AptRepo("cuda", uri, "/", (), trusted=True)
    return AptRepo("cuda", uri, "/", (), key_url=uri + CUDA_KEY)


def plan_operations(ctx: RoleContext, plan: GpuPlan) -> Iterable[Operation | Skip]:
    """The operations for a GPU host that passed the checks."""
    driver_loaded = plan.driver_ready
    if plan.repo_url:
        yield cuda_repo(ctx, plan.repo_url)
    else:
        yield Skip(
            "CUDA repository", f"{plan.platform}: the driver comes from DGX OS's own NVIDIA repositories"
        )
    if plan.headers_package:
        yield AptPackage(plan.headers_package)
    for package in APT_PACKAGES:
        yield AptPackage(package)
    yield File(NOUVEAU_CONF, "blacklist nouveau\noptions nouveau modeset=0\n", notify=(UPDATE_INITRAMFS,))
    if plan.version_glob:
        yield File(APT_PIN, apt_pin(plan.version_glob))
    yield File(UNATTENDED_BLACKLIST, unattended_blacklist())
    for package in plan.packages:
        yield AptPackage(package, version=plan.version_glob, hold=True)
    if plan.fabric_manager.do:
        yield AptPackage(plan.fabric_manager_package, version=plan.version_glob, hold=True)
        # Started only once the pinned driver is loaded; before the reboot it cannot talk to it.
        yield Service("nvidia-fabricmanager.service", enabled=True, running=True if driver_loaded else None)
    else:
        yield Skip("nvidia-fabricmanager", plan.fabric_manager.reason)
    for package in plan.extras.packages:
        yield AptPackage(package)
    if plan.extras.imex:
        yield Service("nvidia-imex.service", enabled=True, running=True if driver_loaded else None)
    if plan.persistence.do:
        yield Service("nvidia-persistenced.service", enabled=True, running=True if driver_loaded else None)
    else:
        yield Skip("nvidia-persistenced", plan.persistence.reason)
    if plan.gpudirect.mode == "peermem":
        peermem = KernelModule("nvidia-peermem", present=True, persist=True)
        if driver_loaded:
            yield peermem
        else:  # modprobe fails until the pinned driver is loaded: only persist it for the next boot
            yield File(peermem.load_path, "nvidia-peermem\n")
    else:
        yield Skip("nvidia-peermem", f"GPUDirect {plan.gpudirect.mode}: {plan.gpudirect.reason}")
    if plan.reboot_reasons:
        yield Skip(REBOOT_REQUIRED, "; ".join(plan.reboot_reasons))


def check_available(ctx: RoleContext, plan: GpuPlan, facts: FactSource) -> None:
    """Refuse, before anything is installed, a package (or pinned version) the host's repository lacks; only
    once that repository is configured as planned (before, apt cannot say: this run's apt-get update will)."""
    if plan.repo_url and facts.get(FileContent(CUDA_SOURCE)) != cuda_repo(ctx, plan.repo_url).source_line():
        return
    names = (*plan.packages, *((plan.fabric_manager_package,) if plan.fabric_manager.do else ()))
    where = plan.repo_url or f"{plan.platform}'s NVIDIA repositories"
    error = missing_packages(ctx.host.name, where, facts.get(AptPolicy(names)), plan.version_glob)
    if error:
        raise HardwareError(error)


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    """Detect the GPUs, then install and pin the driver stack (or skip / refuse with the reason)."""
    gpu_facts = gather_gpu_facts(facts)
    profile = ctx.profile
    plan = plan_gpu(
        ctx.host.name, profile.gpu, gpu_facts, uses_rdma(profile, ctx.host), profile.mirrors.cuda_repo
    )
    if plan.skip:
        yield Skip("NVIDIA driver", plan.skip)
        return
    if plan.error:
        raise HardwareError(plan.error)
    check_available(ctx, plan, facts)
    yield from plan_operations(ctx, plan)
