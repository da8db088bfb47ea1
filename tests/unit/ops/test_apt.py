"""Debian packages: dpkg/apt-mark facts on real outputs, AptPackage/AptRepo/AptUpdate plans."""

from __future__ import annotations

import pytest

from pdfleet.ops.apt import (
    APT_INSTALL,
    AptHolds,
    AptPackage,
    AptPackages,
    AptPolicy,
    AptRepo,
    AptUpdate,
    CommandRc,
    parse_dpkg_query,
)
from pdfleet.ops.base import FakeFacts
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.files import FileState
from tests.unit.ops.helpers import commands, file_info

DPKG = (
    "curl\tii \t7.88.1-10+deb12u14\n"
    "libc6\tii \t2.36-9+deb12u14\n"
    "nvidia-driver\thi \t550.127.05-1\n"
    "openssh-server\tii \t1:9.2p1-2+deb12u10\n"
    "oldpkg\trc \t1.0-1\n"
    "halfpkg\tiU \t2.0-1\n"
    "libfoo:amd64\tii \t3.1\n"
)


def test_dpkg_query_keeps_installed_and_held_drops_removed() -> None:
    assert parse_dpkg_query(DPKG) == {
        "curl": "7.88.1-10+deb12u14",
        "libc6": "2.36-9+deb12u14",
        "nvidia-driver": "550.127.05-1",
        "openssh-server": "1:9.2p1-2+deb12u10",
        "libfoo": "3.1",
    }


def test_apt_packages_named_reports_missing_as_none() -> None:
    fact = AptPackages(("curl", "oldpkg", "nosuch"))
    assert fact.parse(DPKG, 1) == {"curl": "7.88.1-10+deb12u14", "oldpkg": None, "nosuch": None}
    assert "dpkg-query -W -f" in fact.command() and "nosuch" in fact.command()


def test_apt_holds() -> None:
    assert AptHolds().parse("nvidia-driver\nlibnvidia-compute:amd64\n", 0) == frozenset(
        {"nvidia-driver", "libnvidia-compute"}
    )
    with pytest.raises(FactError):
        AptHolds().parse("", 100)


def test_apt_package_pinned_and_held() -> None:
    op = AptPackage("nvidia-driver", version="550.127.05-1", hold=True)
    converged = FakeFacts(
        {AptPackages(): {"nvidia-driver": "550.127.05-1"}, AptHolds(): frozenset({"nvidia-driver"})}
    )
    assert op.plan(converged) == []
    fresh = FakeFacts({AptPackages(): {}, AptHolds(): frozenset()})
    assert commands(op.plan(fresh)) == [
        f"{APT_INSTALL} nvidia-driver=550.127.05-1",
        "apt-mark hold nvidia-driver",
    ]
    older = FakeFacts({AptPackages(): {"nvidia-driver": "535.0-1"}, AptHolds(): frozenset({"nvidia-driver"})})
    changes = op.plan(older)
    assert commands(changes) == [f"{APT_INSTALL} nvidia-driver=550.127.05-1"]
    assert changes[0].diff == "nvidia-driver 535.0-1 → 550.127.05-1"


def test_apt_package_unpinned_and_glob() -> None:
    assert AptPackage("curl").plan(FakeFacts({AptPackages(): {"curl": "7.88"}})) == []
    assert commands(AptPackage("curl").plan(FakeFacts({AptPackages(): {}}))) == [f"{APT_INSTALL} curl"]
    glob = AptPackage("nvidia-fabricmanager-550", version="550.*")
    assert glob.plan(FakeFacts({AptPackages(): {"nvidia-fabricmanager-550": "550.127.05-1"}})) == []


def test_apt_repo_with_key_and_update() -> None:
    key = "-----BEGIN PGP PUBLIC KEY BLOCK-----\nabc\n-----END PGP PUBLIC KEY BLOCK-----\n"
    repo = AptRepo(
        "cuda",
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/",
        "/",
        components=(),
        key=key,
        arch="amd64",
    )
    line = (
        "deb [arch=amd64 signed-by=/etc/apt/keyrings/cuda.asc] "
        "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /\n"
    )
    assert repo.source_line() == line
    listfile = "/etc/apt/sources.list.d/cuda.list"
    fresh = FakeFacts({FileState("/etc/apt/keyrings/cuda.asc"): None, FileState(listfile): None})
    assert commands(repo.plan(fresh)) == [
        ("/etc/apt/keyrings/cuda.asc", "0644", "root", "root", key.encode()),
        (listfile, "0644", "root", "root", line.encode()),
        "DEBIAN_FRONTEND=noninteractive apt-get update -q",
    ]
    converged = FakeFacts(
        {FileState("/etc/apt/keyrings/cuda.asc"): file_info(key), FileState(listfile): file_info(line)}
    )
    assert repo.plan(converged) == []


def test_apt_repo_trusted_mirror_and_key_url() -> None:
    mirror = AptRepo("pdfleet-mirror", "http://198.18.0.1:8081/", "bookworm", trusted=True)
    assert mirror.source_line() == "deb [trusted=yes] http://198.18.0.1:8081/ bookworm main\n"
    remote = AptRepo("x", "https://repo.example/", "stable", key_url="https://repo.example/key.gpg")
    changes = remote.plan(
        FakeFacts(
            {FileState("/etc/apt/keyrings/x.gpg"): None, FileState("/etc/apt/sources.list.d/x.list"): None}
        )
    )
    cmds = commands(changes)
    assert "curl -fsSL https://repo.example/key.gpg -o /etc/apt/keyrings/x.gpg.tmp" in str(cmds[0])
    with pytest.raises(OperationError):
        AptRepo("y", "https://r/", "s").plan(FakeFacts())


def test_apt_repo_binary_key_goes_to_a_gpg_keyring() -> None:
    key = b"\x99\x01\x0d\x04binary-openpgp"
    repo = AptRepo("nv", "https://repo.example/", "stable", key=key)
    assert repo.keyring_path() == "/etc/apt/keyrings/nv.gpg"
    line = "deb [signed-by=/etc/apt/keyrings/nv.gpg] https://repo.example/ stable main\n"
    assert repo.source_line() == line
    fresh = FakeFacts(
        {FileState("/etc/apt/keyrings/nv.gpg"): None, FileState("/etc/apt/sources.list.d/nv.list"): None}
    )
    changes = repo.plan(fresh)
    assert commands(changes)[0] == ("/etc/apt/keyrings/nv.gpg", "0644", "root", "root", key)
    assert {c.op for c in changes} == {"apt repo nv"}  # the files it writes report under the repo's name


def test_apt_update_guarded_by_age() -> None:
    op = AptUpdate(max_age_minutes=30)
    fresh_check = "find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -30 2>/dev/null | grep -q ."
    assert op.plan(FakeFacts({CommandRc(fresh_check): 0})) == []
    assert commands(op.plan(FakeFacts({CommandRc(fresh_check): 1}))) == [
        "DEBIAN_FRONTEND=noninteractive apt-get update -q"
    ]


# `LC_ALL=C apt-cache policy` as apt prints it (apt-cache(8)): the installed version marked ***, one priority
# and source line per version; a package apt cannot locate prints no block (the message goes to stderr).
POLICY = (
    "rdma-core:\n"
    "  Installed: 44.0-2\n"
    "  Candidate: 44.0-2\n"
    "  Version table:\n"
    " *** 44.0-2 500\n"
    "        500 http://deb.debian.org/debian bookworm/main amd64 Packages\n"
    "        100 /var/lib/dpkg/status\n"
    "perftest:\n"
    "  Installed: (none)\n"
    "  Candidate: 4.5+0.17-1\n"
    "  Version table:\n"
    "     4.5+0.17-1 500\n"
    "        500 http://deb.debian.org/debian bookworm/main amd64 Packages\n"
)


def test_apt_policy_lists_every_version_apt_knows_and_none_for_an_unknown_package() -> None:
    fact = AptPolicy(("rdma-core", "perftest", "cuda-drivers-590"))
    assert fact.parse(POLICY, 0) == {
        "rdma-core": ("44.0-2",),
        "perftest": ("4.5+0.17-1",),
        "cuda-drivers-590": (),
    }
    assert fact.command() == "LC_ALL=C apt-cache policy rdma-core perftest cuda-drivers-590 2>/dev/null; true"
