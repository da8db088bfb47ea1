"""Distribution decisions: from the OS fact to the supported platform, NVIDIA's repository for it, and the
driver, open-module, Fabric Manager and IMEX/NVLink5 package names for the profile's branch.

Pure functions; a refusal is one line naming the host, what it runs and what is supported. Package names
per platform (reference/provisioning.md §1):
- Debian 12 (CUDA repository): `nvidia-kernel-open-B` + `cuda-drivers-B`, Fabric Manager
  `nvidia-fabricmanager-B` (NIXL's GPU host recipe, NVIDIA's driver role).
- Ubuntu 22.04/24.04 (CUDA repository): `nvidia-driver-B-open` + `cuda-drivers-B` (NVIDIA's CUDA
  installation guide, "open kernel module flavor" on Ubuntu); Fabric Manager `nvidia-fabricmanager-B` on
  22.04, `nvidia-fabricmanager` on 24.04 (DeepOps nvidia-dgx vars/ubuntu-22.04.yml, vars/ubuntu-24.04.yml).
- DGX OS 6: `nvidia-driver-B-server` + `linux-modules-nvidia-B-server-nvidia` (DeepOps), or the archive's
  `nvidia-driver-B-server-open`; DGX OS 7: `nvidia-driver-B-open`, `nvidia-fabricmanager`, `nvidia-imex` on
  GB200/GB300, `nvlsm` + `libnvsdm` on NVLink5 (B200/B300) systems (DeepOps vars/ubuntu-24.04.yml).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

from pdfleet.hw.os_facts import OsRelease
from pdfleet.model.platforms import Platform, branch_span, find_platform, supported_names

CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
CUDA_SOURCE = "/etc/apt/sources.list.d/cuda.list"  # where the gpu_driver role writes the repository line
Override = str | dict[str, str] | None  # the profile's mirrors.cuda_repo
CUDA_KEY = "3bf863cc.pub"  # the CUDA repositories' signing key (rotated in 2022)
# CUDA repository architecture per `uname -m` (NVIDIA's driver role, commit 705bb08: aarch64 → sbsa)
CUDA_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}
# DGX OS 7's platform table (DeepOps nvidia-dgx vars/ubuntu-24.04.yml), keyed on the DMI product name
IMEX_PRODUCTS = re.compile(r"DGX[ -]?GB(200|300)|DGXGB(200|300)")
NVLINK5_PRODUCTS = re.compile(r"DGX[ -]?B(200|300)|DGXB(200|300)")
NVLINK5_PACKAGES = ("nvlsm", "libnvsdm")
IMEX_PACKAGE = "nvidia-imex"


class PlatformRefusal(ValueError):
    """The host's platform cannot take this plan; the message is the one line an operator reads."""


def resolve_platform(host: str, os: OsRelease) -> Platform:
    """The supported platform the host runs; PlatformRefusal naming what it runs and what is supported."""
    platform = find_platform(os.id, os.version_id, os.dgx)
    if platform is None:
        raise PlatformRefusal(
            f"{host}: runs {os.describe()}, which pdfleet does not provision; supported: {supported_names()}"
        )
    return platform


def check_branch(host: str, platform: Platform, branch: str) -> None:
    """PlatformRefusal when the platform's repository has no packages of the branch, naming those it has."""
    if branch not in platform.branches:
        raise PlatformRefusal(
            f"{host}: gpu.driver_branch {branch} has no driver packages on {platform.name}; "
            f"its repository carries {branch_span(platform.branches)}"
        )


def cuda_repo_url(host: str, platform: Platform, arch: str, override: Override) -> str | None:
    """The driver repository: the profile's mirror for this platform, else NVIDIA's CUDA repository for the
    distribution and architecture; None on DGX OS without a mirror (its NVIDIA repositories are set up)."""
    url = override.get(platform.key) if isinstance(override, dict) else override
    if url:
        return url if url.endswith("/") else url + "/"
    if platform.cuda_repo is None:
        return None
    if arch not in CUDA_ARCH:
        raise PlatformRefusal(
            f"{host}: {platform.name} on {arch or 'an unknown architecture'} has no CUDA repository; "
            f"supported: {', '.join(CUDA_ARCH)}"
        )
    return f"{CUDA_REPOS}/{platform.cuda_repo}/{CUDA_ARCH[arch]}/"


def repository_drift(
    host: str, platform: Platform, os: OsRelease, override: Override, listed: str
) -> str | None:
    """Why the CUDA repository line a host has (`listed`, the content of CUDA_SOURCE) is not the one its
    platform needs now, e.g. after an in-place upgrade from 22.04 to 24.04; None when it is, or on DGX OS."""
    want = cuda_repo_url(host, platform, os.arch, override)
    if want is None or want in listed:
        return None
    found = re.search(r"\b\w+://\S+", listed)
    return (
        f"{host} runs {platform.name}, but {CUDA_SOURCE} names {found[0] if found else 'no repository'}; "
        f"provision plans {want}"
    )


def missing_packages(
    host: str, where: str, versions: dict[str, tuple[str, ...]], version_glob: str | None
) -> str | None:
    """A refusal when the configured repositories (`apt-cache policy`) offer no version of a package the plan
    installs, or none matching the pinned version; None when each can be installed as planned."""
    for name, have in versions.items():
        if not have:
            return f"{host}: {name} is in none of the configured repositories ({where})"
        if version_glob and not any(fnmatchcase(v, version_glob) for v in have):
            return f"{host}: {name}={version_glob} is not in {where}; it has {', '.join(have[:6])}"
    return None


def driver_packages(host: str, platform: Platform, branch: str, open_modules: bool) -> tuple[str, ...]:
    """The driver packages of the branch, the open kernel modules' package first (so apt never builds the
    proprietary module only to replace it)."""
    if platform.key == "dgxos7":
        if not open_modules:
            raise PlatformRefusal(
                f"{host}: DGX OS 7 installs the open kernel modules only (nvidia-driver-{branch}-open); "
                "set gpu.open_modules: true"
            )
        return (f"nvidia-driver-{branch}-open",)
    if platform.key == "dgxos6":
        if open_modules:
            return (f"nvidia-driver-{branch}-server-open",)
        return (f"nvidia-driver-{branch}-server", f"linux-modules-nvidia-{branch}-server-nvidia")
    if not open_modules:
        return (f"cuda-drivers-{branch}",)
    if platform.os_id == "ubuntu":
        return (f"nvidia-driver-{branch}-open", f"cuda-drivers-{branch}")
    return (f"nvidia-kernel-open-{branch}", f"cuda-drivers-{branch}")


def fabric_manager_package(platform: Platform, branch: str) -> str:
    """Fabric Manager's package: unsuffixed on Ubuntu 24.04 and DGX OS 7, branch-suffixed elsewhere (the
    role pins it to the driver's exact version either way)."""
    return "nvidia-fabricmanager" if platform.version_id == "24.04" else f"nvidia-fabricmanager-{branch}"


@dataclass(frozen=True)
class PlatformExtras:
    """Packages a system needs beside driver and Fabric Manager, and why (or why none)."""

    packages: tuple[str, ...]
    imex: bool
    reason: str


def platform_extras(platform: Platform, product: str) -> PlatformExtras:
    """IMEX on GB200/GB300, NVLink5 tools on B200/B300, as DGX OS 7's platform table has them; elsewhere
    none (no table names them)."""
    if platform.key != "dgxos7":
        return PlatformExtras((), False, f"{platform.name}: no IMEX/NVLink5 packages planned (DGX OS 7 only)")
    if IMEX_PRODUCTS.search(product):
        return PlatformExtras((IMEX_PACKAGE,), True, f"{product}: IMEX")
    if NVLINK5_PRODUCTS.search(product):
        return PlatformExtras(NVLINK5_PACKAGES, False, f"{product}: NVLink5")
    return PlatformExtras((), False, f"{product or 'unknown product'}: neither IMEX nor NVLink5")
