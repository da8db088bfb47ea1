"""Platform checks: the host runs a platform pdfleet provisions, and a GPU host's driver repository and
branch are those provision plans for what it runs now (a host upgraded in place is named, not a mystery).

The same OS fact and decisions as provision (pdfleet.hw.os_facts, pdfleet.hw.distro).
"""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.checks.hosts.gpu import gpu_host
from pdfleet.checks.verify import VerifyPlugin, remote_fact
from pdfleet.hw.distro import CUDA_SOURCE, PlatformRefusal, check_branch, repository_drift, resolve_platform
from pdfleet.hw.gpu import driver_branch
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.model.inventory import Host
from pdfleet.model.platforms import Platform


def platform_of(pd_host: Host, target: Any) -> Platform:
    """The host's platform; fails with provision's own one-line refusal when it is not supported."""
    try:
        return resolve_platform(pd_host.name, remote_fact(target, OsReleaseFact()))
    except PlatformRefusal as exc:
        pytest.fail(str(exc), pytrace=False)


def test_supported(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    platform_of(pd_host, target)


def test_driver_branch_and_repository(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    gpu_host(verify, pd_host, target)
    platform = platform_of(pd_host, target)
    try:
        check_branch(pd_host.name, platform, driver_branch(verify.profile.gpu))
    except PlatformRefusal as exc:
        pytest.fail(str(exc), pytrace=False)
    listed = target.file(CUDA_SOURCE)
    content = listed.content_string if listed.exists else ""
    os = remote_fact(target, OsReleaseFact())
    drift = repository_drift(pd_host.name, platform, os, verify.profile.mirrors.cuda_repo, content)
    assert drift is None, drift
