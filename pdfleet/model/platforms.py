"""The platforms pdfleet provisions (Debian 12, Ubuntu 22.04 and 24.04, DGX OS 6 and 7) and the NVIDIA driver
branches each one's package repository carries.

Facts about the world, like the catalog: `invoke profiles` checks a profile's branch against them, and the
hardware decisions (pdfleet.hw.distro) read the same table when a host's /etc/os-release is known.
Sources (reference/provisioning.md §1; the NVIDIA driver role's pull requests #65 and #89):
- CUDA repositories carry a driver branch as `cuda-drivers-B`; from R590 on NVIDIA's packages drop the
  branch from their names (NVIDIA Driver Installation Guide, "Ubuntu 590 package renames": cuda-drivers-580
  is the last), so 580 is the newest branch that can be pinned by name on every platform (PR #89 checked
  the Ubuntu 22.04 and 24.04 CUDA repositories: branch-suffixed packages top out at 580).
- debian12 opened with CUDA 12.2 (R535); ubuntu2204 starts at R515 (PR #65: no cuda-drivers-510 there);
  ubuntu2404 opened with CUDA 12.5 (R555), and has no cuda-drivers-515 (PR #89).
- DGX OS keeps NVIDIA's own repositories: DeepOps' nvidia-dgx role installs R550 on DGX OS 6
  (vars/ubuntu-22.04.yml, `dgx_os6_driver_branch`) and R580 on DGX OS 7 (vars/ubuntu-24.04.yml).
"""

from __future__ import annotations

from dataclasses import dataclass

# Branches NVIDIA published as branch-suffixed packages (cuda-drivers-B), oldest first.
CUDA_BRANCHES = ("515", "520", "525", "530", "535", "545", "550", "555", "560", "565", "570", "575", "580")


def _since(first: str) -> tuple[str, ...]:
    """The branches from `first` on."""
    return CUDA_BRANCHES[CUDA_BRANCHES.index(first) :]


@dataclass(frozen=True)
class Platform:
    """One supported platform: how /etc/os-release (and /etc/dgx-release) names it, its driver repository."""

    key: str  # debian12, ubuntu2204, ubuntu2404, dgxos6, dgxos7: the keys of mirrors.cuda_repo overrides
    name: str  # what operators read
    os_id: str  # os-release ID
    version_id: str  # os-release VERSION_ID
    dgx: bool  # DGX OS (marked by /etc/dgx-release)
    cuda_repo: str | None  # .../cuda/repos/<this>/<arch>/; None: DGX OS's own NVIDIA repositories
    branches: tuple[str, ...]  # driver branches its repository carries


PLATFORMS: tuple[Platform, ...] = (
    Platform("debian12", "Debian 12", "debian", "12", False, "debian12", _since("535")),
    Platform("ubuntu2204", "Ubuntu 22.04", "ubuntu", "22.04", False, "ubuntu2204", _since("515")),
    Platform("ubuntu2404", "Ubuntu 24.04", "ubuntu", "24.04", False, "ubuntu2404", _since("555")),
    Platform("dgxos6", "DGX OS 6 (Ubuntu 22.04)", "ubuntu", "22.04", True, None, ("550",)),
    Platform("dgxos7", "DGX OS 7 (Ubuntu 24.04)", "ubuntu", "24.04", True, None, ("580",)),
)
PLATFORM_KEYS = tuple(p.key for p in PLATFORMS)


def find_platform(os_id: str, version_id: str, dgx: bool) -> Platform | None:
    """The supported platform with this os-release ID and VERSION_ID (DGX OS or not), or None."""
    return next(
        (p for p in PLATFORMS if (p.os_id, p.version_id, p.dgx) == (os_id, version_id, dgx)),
        None,
    )


def supported_names() -> str:
    """`Debian 12, Ubuntu 22.04, ...`: the supported platforms, as a refusal lists them."""
    return ", ".join(p.name for p in PLATFORMS)


def branch_span(branches: tuple[str, ...]) -> str:
    """`535-580` for a run of branches, the branch alone for one."""
    return branches[0] if len(branches) == 1 else f"{branches[0]}-{branches[-1]}"


def branches_by_platform(platforms: tuple[Platform, ...] = PLATFORMS) -> str:
    """`Debian 12: 535-580; ...`: the branches each platform carries, as a refusal lists them."""
    return "; ".join(f"{p.name}: {branch_span(p.branches)}" for p in platforms)


def platforms_with(branch: str) -> tuple[Platform, ...]:
    """The platforms whose repository carries the branch."""
    return tuple(p for p in PLATFORMS if branch in p.branches)
