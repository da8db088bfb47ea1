"""The supported-platform table and the profile checks built on it (`invoke profiles` refuses a branch no
platform carries, or one missing on a platform the profile names a CUDA mirror for)."""

from __future__ import annotations

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.platforms import PLATFORMS, branches_by_platform, find_platform, platforms_with
from pdfleet.model.profile_loader import load_profile
from tests.unit.model.helpers import GOOD


def test_find_platform_tells_dgx_os_from_plain_ubuntu() -> None:
    plain, dgx = find_platform("ubuntu", "24.04", False), find_platform("ubuntu", "24.04", True)
    assert plain is not None and dgx is not None and (plain.key, dgx.key) == ("ubuntu2404", "dgxos7")
    assert find_platform("rocky", "9.4", False) is None and find_platform("debian", "13", False) is None
    assert [p.key for p in platforms_with("515")] == ["ubuntu2204"]
    assert branches_by_platform(PLATFORMS[:2]) == "Debian 12: 535-580; Ubuntu 22.04: 515-580"


def _load(tmp_path, body: str):  # type: ignore[no-untyped-def]  # the profile `p` in a directory of its own
    (tmp_path / "_good.yml").write_text(GOOD)
    (tmp_path / "p.yml").write_text(body)
    return load_profile("p", tmp_path)


def test_a_branch_no_platform_carries_is_refused_with_the_branches_each_has(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as err:
        _load(tmp_path, 'extends: _good\ngpu: {driver_branch: "590"}\n')
    assert "gpu.driver_branch: 590 has no driver packages on Debian 12, Ubuntu 22.04" in str(err.value)
    assert "Ubuntu 24.04: 555-580" in str(err.value)


def test_a_branch_missing_on_a_platform_the_profile_mirrors_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    body = (
        'extends: _good\ngpu: {driver_branch: "550"}\nmirrors: {cuda_repo: {ubuntu2404: "http://m/cuda/"}}\n'
    )
    with pytest.raises(ValidationError, match="550 has no driver packages on Ubuntu 24.04"):
        _load(tmp_path, body)
    ok = _load(
        tmp_path,
        'extends: _good\ngpu: {driver_branch: "550"}\nmirrors: {cuda_repo: {ubuntu2204: "http://m/"}}\n',
    )
    assert ok.mirrors.cuda_repo == {"ubuntu2204": "http://m/"}


def test_cuda_repo_keys_and_urls_are_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError) as err:
        _load(
            tmp_path, 'extends: _good\nmirrors: {cuda_repo: {rocky9: "http://m/", ubuntu2204: "ftp://m/"}}\n'
        )
    assert "mirrors.cuda_repo.rocky9: is not a platform" in str(err.value)
    assert "mirrors.cuda_repo.ubuntu2204: must be an http:// or https:// URL" in str(err.value)
