"""Each supported distribution's gpu_driver and rdma plans from its fixtures (OS facts recorded per
distribution, on the H100 HGX hardware fixture), and the refusals of an unsupported OS or branch."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import pytest

import roles.gpu_driver as gpu_role
import roles.rdma as rdma_role
from pdfleet.fleet.provision import plan_host
from pdfleet.hw import HardwareError
from pdfleet.hw.distro import (
    CUDA_SOURCE,
    PlatformRefusal,
    cuda_repo_url,
    missing_packages,
    platform_extras,
    repository_drift,
    resolve_platform,
)
from pdfleet.hw.gpu import gather_gpu_facts, plan_gpu
from pdfleet.hw.kv import uses_rdma
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.hw.rdma import INBOX_PACKAGES
from pdfleet.model.platforms import PLATFORMS, find_platform
from pdfleet.ops.apt import AptPackage, AptRepo
from pdfleet.ops.base import Upload
from pdfleet.ops.files import FileContent, FileState, PathInfo
from tests.unit.fleet.helpers import REPO, deploy
from tests.unit.hw.helpers import commands, context, fixture_facts, host, load_fixture, pinned, run_role
from tests.unit.roles.helpers import deployment

H100 = "h100-sxm-8x-nvswitch-cx7"
CUDA = "https://developer.download.nvidia.com/compute/cuda/repos"
# distribution fixture → (branch, version, repository, driver packages, headers, Fabric Manager, DOCA-OFED)
EXPECTED: dict[str, tuple[str, str, str | None, tuple[str, ...], str, str, bool]] = {
    "debian-12": (
        "570",
        "570.133.20",
        f"{CUDA}/debian12/x86_64/",
        ("nvidia-kernel-open-570", "cuda-drivers-570"),
        "linux-headers-6.1.0-31-amd64",
        "nvidia-fabricmanager-570",
        False,
    ),
    "ubuntu-22.04": (
        "570",
        "570.133.20",
        f"{CUDA}/ubuntu2204/x86_64/",
        ("nvidia-driver-570-open", "cuda-drivers-570"),
        "linux-headers-6.8.0-52-generic",
        "nvidia-fabricmanager-570",
        False,
    ),
    "ubuntu-24.04": (
        "580",
        "580.95.05",
        f"{CUDA}/ubuntu2404/x86_64/",
        ("nvidia-driver-580-open", "cuda-drivers-580"),
        "linux-headers-6.8.0-56-generic",
        "nvidia-fabricmanager",
        False,
    ),
    "dgx-os-6": (
        "550",
        "550.163.01",
        None,
        ("nvidia-driver-550-server-open",),
        "linux-headers-5.15.0-1042-nvidia",
        "nvidia-fabricmanager-550",
        False,
    ),
    "dgx-os-7": (
        "580",
        "580.159.03",
        None,
        ("nvidia-driver-580-open",),
        "linux-headers-6.8.0-1025-nvidia",
        "nvidia-fabricmanager",
        True,
    ),
}


def on(distro: str, overrides: dict[Any, Any] | None = None) -> Any:
    """The H100 hardware fixture running this distribution (its OS, kernel and package facts)."""
    return fixture_facts(H100, {**load_fixture(distro), **(overrides or {})})


@pytest.mark.parametrize("distro", sorted(EXPECTED))
def test_each_distribution_plans_its_repository_packages_headers_and_fabric_manager(distro: str) -> None:
    branch, version, repo, packages, headers, fabric_manager, _ = EXPECTED[distro]
    prof = pinned(driver_branch=branch, driver_version=version)
    facts = on(distro)
    plan = plan_gpu("gpu-01", prof.gpu, gather_gpu_facts(facts), uses_rdma(prof, host()))
    assert plan.error is None and plan.skip is None
    assert (plan.repo_url, plan.packages, plan.headers_package) == (repo, packages, headers)
    assert plan.fabric_manager.do and plan.fabric_manager_package == fabric_manager
    ops, skips, changes = run_role(gpu_role, context(prof, host()), facts)
    cmds = commands(changes)
    repos = [op for op in ops if isinstance(op, AptRepo)]
    if repo is None:  # DGX OS: its own NVIDIA repositories, said in a skip
        assert not repos and any(s.what == "CUDA repository" and "DGX OS" in s.reason for s in skips)
    else:
        assert [(r.uri, r.key_url) for r in repos] == [(repo, repo + "3bf863cc.pub")]
    for package in (*packages, fabric_manager):
        assert any(f"{package}={version}-*" in c for c in cmds), package
        assert f"apt-mark hold {package}" in cmds
    assert any(c.endswith(f" {headers}") for c in cmds)


@pytest.mark.parametrize("distro", sorted(EXPECTED))
def test_each_distribution_plans_inbox_rdma_core_unless_doca_ofed_is_installed(distro: str) -> None:
    doca = EXPECTED[distro][-1]
    ops, skips, changes = run_role(rdma_role, context(pinned(), host()), on(distro))
    installs = {op.name for op in ops if isinstance(op, AptPackage)}
    if doca:
        assert installs == set() and not any("apt-get install" in c for c in commands(changes))
        [skip] = [s for s in skips if s.what == "inbox RDMA packages"]
        assert "DOCA-OFED" in skip.reason and "2410mlnx54" in skip.reason
    else:
        assert installs == set(INBOX_PACKAGES)
        assert not any(s.what == "inbox RDMA packages" for s in skips)


def test_provision_check_on_an_ubuntu_2404_host_shows_the_ubuntu2404_repository() -> None:
    """provision's planner (every role of cross-rdma) on a host of its example fleet whose facts say 24.04."""
    fleet = deploy("cross-rdma", REPO / "inventory/examples/cross-rdma.yml")
    facts = on("ubuntu-24.04")
    planned = list(plan_host(fleet, fleet.inventory.hosts["colo-01"], facts))
    [repo] = [op for op in planned if isinstance(op, AptRepo)]
    diffs = "\n".join(c.diff for c in repo.plan(facts))
    assert f"deb [signed-by=/etc/apt/keyrings/cuda.asc] {CUDA}/ubuntu2404/x86_64/ /" in diffs
    assert "debian12" not in diffs and f"fetch key {CUDA}/ubuntu2404/x86_64/3bf863cc.pub" in diffs
    names = {op.name for op in planned if isinstance(op, AptPackage)}
    assert {"nvidia-driver-580-open", "cuda-drivers-580", "nvidia-fabricmanager"} <= names


def _repo(prof: Any, distro: str) -> AptRepo:
    return next(
        op for op in run_role(gpu_role, context(prof, host()), on(distro))[0] if isinstance(op, AptRepo)
    )


def test_a_host_upgraded_in_place_from_2204_to_2404_shows_a_plan_change() -> None:
    prof = pinned(driver_branch="580", driver_version="580.95.05")
    before, after = _repo(prof, "ubuntu-22.04"), _repo(prof, "ubuntu-24.04")
    listed = before.source_line().encode()
    digest = hashlib.sha256(listed).hexdigest()
    state = {  # the repository as provision left it while the host ran 22.04
        FileState("/etc/apt/sources.list.d/cuda.list"): PathInfo(
            "file", "0644", "root", "root", len(listed), digest
        ),
        FileState("/etc/apt/keyrings/cuda.asc"): PathInfo("file", "0644", "root", "root", 3, "0" * 64),
    }
    assert before.plan(on("ubuntu-22.04", state)) == []  # converged on 22.04
    changes = after.plan(on("ubuntu-24.04", state))
    assert "ubuntu2204" in before.uri and "ubuntu2404" in after.uri
    uploads = [cmd for c in changes for cmd in c.commands if isinstance(cmd, Upload)]
    assert [(u.dest, u.content) for u in uploads] == [
        ("/etc/apt/sources.list.d/cuda.list", after.source_line().encode())
    ]
    assert changes[-1].diff == "apt-get update"


def test_an_unsupported_distribution_is_refused_before_anything_with_one_line() -> None:
    facts = fixture_facts("lab-container", load_fixture("rocky-9"))
    lab = deployment("lab-cross")
    for roles in (lab.roles, (rdma_role,)):  # whichever roles run (--roles), nothing is planned there
        only = dataclasses.replace(lab, roles=roles)
        with pytest.raises(HardwareError) as err:
            list(plan_host(only, dataclasses.replace(lab.inventory.hosts["lab-p1"], name="gpu-07"), facts))
    message = str(err.value)
    assert "\n" not in message and message.startswith("gpu-07: runs Rocky Linux 9.4 (Blue Onyx)")
    assert "supported: Debian 12, Ubuntu 22.04, Ubuntu 24.04, DGX OS 6 (Ubuntu 22.04), DGX OS 7" in message
    on_gpu = plan_gpu("gpu-07", pinned().gpu, gather_gpu_facts(on("rocky-9")), True)
    assert on_gpu.error == message and on_gpu.packages == ()


def test_a_branch_missing_for_the_distribution_is_refused_naming_the_branches_it_has() -> None:
    prof = pinned(driver_branch="550", driver_version="550.163.01")
    plan = plan_gpu("gpu-01", prof.gpu, gather_gpu_facts(on("ubuntu-24.04")), True)
    assert plan.error == (
        "gpu-01: gpu.driver_branch 550 has no driver packages on Ubuntu 24.04; its repository carries 555-580"
    )
    with pytest.raises(HardwareError, match="555-580"):
        list(gpu_role.operations(context(prof, host()), on("ubuntu-24.04")))
    assert plan_gpu("gpu-01", prof.gpu, gather_gpu_facts(on("ubuntu-22.04")), True).error is None


def test_dgx_os_7_refuses_the_proprietary_modules_and_dgx_os_6_installs_precompiled_ones() -> None:
    dgx7 = gather_gpu_facts(on("dgx-os-7"))
    closed = pinned(driver_branch="580", driver_version="580.95.05", open_modules=False)
    assert "open kernel modules only" in (plan_gpu("gpu-01", closed.gpu, dgx7, True).error or "")
    closed6 = pinned(driver_branch="550", driver_version="550.163.01", open_modules=False)
    plan = plan_gpu("gpu-01", closed6.gpu, gather_gpu_facts(on("dgx-os-6")), True)
    assert plan.packages == ("nvidia-driver-550-server", "linux-modules-nvidia-550-server-nvidia")


def test_imex_on_gb200_and_nvlink5_tools_on_b200_under_dgx_os_7() -> None:
    dgx7 = find_platform("ubuntu", "24.04", True)
    assert dgx7 is not None
    gb200 = platform_extras(dgx7, "DGXGB200")
    assert gb200.packages == ("nvidia-imex",) and gb200.imex
    assert platform_extras(dgx7, "DGX B200").packages == ("nvlsm", "libnvsdm")
    assert platform_extras(dgx7, "DGXH100").packages == ()
    ubuntu = find_platform("ubuntu", "24.04", False)
    assert ubuntu is not None and platform_extras(ubuntu, "DGXGB200").packages == ()
    os = dataclasses.replace(load_fixture("dgx-os-7")[OsReleaseFact()], product_name="DGXGB200")
    prof = pinned(driver_branch="580", driver_version="580.159.03")
    ops, _, _ = run_role(gpu_role, context(prof, host()), on("dgx-os-7", {OsReleaseFact(): os}))
    assert any(isinstance(op, AptPackage) and op.name == "nvidia-imex" for op in ops)
    assert any(getattr(op, "unit", "") == "nvidia-imex.service" for op in ops)


def test_aarch64_uses_the_sbsa_repository_and_a_per_distribution_mirror_wins() -> None:
    ubuntu = resolve_platform("h", load_fixture("ubuntu-24.04")[OsReleaseFact()])
    assert cuda_repo_url("h", ubuntu, "aarch64", None) == f"{CUDA}/ubuntu2404/sbsa/"
    mirrors = {"ubuntu2404": "http://198.18.0.1:8081/cuda-noble"}
    assert cuda_repo_url("h", ubuntu, "x86_64", mirrors) == "http://198.18.0.1:8081/cuda-noble/"
    debian = resolve_platform("h", load_fixture("debian-12")[OsReleaseFact()])
    assert cuda_repo_url("h", debian, "x86_64", mirrors) == f"{CUDA}/debian12/x86_64/"
    with pytest.raises(PlatformRefusal, match="ppc64le"):
        cuda_repo_url("h", ubuntu, "ppc64le", None)


def test_every_platform_names_branches_within_the_cuda_branch_list() -> None:
    assert {p.key for p in PLATFORMS} == {"debian12", "ubuntu2204", "ubuntu2404", "dgxos6", "dgxos7"}
    assert all(p.branches and p.branches == tuple(sorted(p.branches)) for p in PLATFORMS)


def test_repository_drift_names_what_the_host_has_and_what_provision_plans() -> None:
    os = load_fixture("ubuntu-24.04")[OsReleaseFact()]
    noble = resolve_platform("gpu-01", os)
    jammy_line = f"deb [signed-by=/etc/apt/keyrings/cuda.asc] {CUDA}/ubuntu2204/x86_64/ /\n"
    assert repository_drift("gpu-01", noble, os, None, jammy_line) == (
        f"gpu-01 runs Ubuntu 24.04, but /etc/apt/sources.list.d/cuda.list names {CUDA}/ubuntu2204/x86_64/; "
        f"provision plans {CUDA}/ubuntu2404/x86_64/"
    )
    assert repository_drift("gpu-01", noble, os, None, jammy_line.replace("2204", "2404")) is None
    assert "names no repository" in (repository_drift("gpu-01", noble, os, None, "") or "")
    dgx = load_fixture("dgx-os-7")[OsReleaseFact()]
    assert repository_drift("gpu-01", resolve_platform("gpu-01", dgx), dgx, None, "") is None


def _configured(prof: Any, distro: str) -> dict[Any, Any]:
    """The host's cuda.list as this plan writes it: the repository is there, so apt-cache policy is asked."""
    return {FileContent(CUDA_SOURCE): _repo(prof, distro).source_line()}


def test_a_configured_repository_is_asked_for_the_pinned_packages_before_anything_changes() -> None:
    prof = pinned(driver_branch="580", driver_version="580.95.05")
    ops, _, _ = run_role(
        gpu_role, context(prof, host()), on("ubuntu-24.04", _configured(prof, "ubuntu-24.04"))
    )
    assert any(isinstance(op, AptPackage) and op.name == "cuda-drivers-580" for op in ops)
    missing = pinned(driver_branch="580", driver_version="580.65.06")
    with pytest.raises(HardwareError) as err:
        list(
            gpu_role.operations(
                context(missing, host()), on("ubuntu-24.04", _configured(missing, "ubuntu-24.04"))
            )
        )
    where = f"{CUDA}/ubuntu2404/x86_64/"
    assert (
        str(err.value)
        == f"gpu-01: nvidia-driver-580-open=580.65.06-* is not in {where}; it has 580.95.05-0ubuntu1"
    )


def test_dgx_os_repositories_are_asked_whatever_cuda_list_holds() -> None:
    prof = pinned(driver_branch="580", driver_version="580.95.05")  # DGX OS 7's repositories carry 580.159.03
    with pytest.raises(HardwareError, match="nvidia-driver-580-open=580.95.05-\\* is not in DGX OS 7"):
        list(gpu_role.operations(context(prof, host()), on("dgx-os-7")))
    assert missing_packages("h", "r", {"p": ()}, None) == "h: p is in none of the configured repositories (r)"


@pytest.mark.parametrize("distro", sorted(EXPECTED))
def test_each_distributions_recorded_apt_cache_policy_offers_the_pinned_packages(distro: str) -> None:
    branch, version, repo, packages, _, fabric_manager, _ = EXPECTED[distro]
    prof = pinned(driver_branch=branch, driver_version=version)
    state = _configured(prof, distro) if repo else {}
    ops, _, _ = run_role(gpu_role, context(prof, host()), on(distro, state))  # no refusal: every name offered
    assert {op.name for op in ops if isinstance(op, AptPackage)} >= {*packages, fabric_manager}
