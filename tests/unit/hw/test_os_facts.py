"""The OS fact's parser against the recorded outputs of each distribution (and what a refusal says)."""

from __future__ import annotations

from pdfleet.hw.os_facts import OsReleaseFact, parse_key_values, parse_os
from tests.unit.hw.helpers import load_fixture


def _os(name: str):  # type: ignore[no-untyped-def]  # a fixture's parsed OS fact
    return load_fixture(name)[OsReleaseFact()]


def test_ubuntu_debian_and_rocky_os_release_parse_to_id_version_and_codename() -> None:
    assert (_os("ubuntu-24.04").id, _os("ubuntu-24.04").version_id, _os("ubuntu-24.04").codename) == (
        "ubuntu",
        "24.04",
        "noble",
    )
    assert (_os("debian-12").id, _os("debian-12").version_id, _os("debian-12").codename) == (
        "debian",
        "12",
        "bookworm",
    )
    rocky = _os("rocky-9")
    assert (rocky.id, rocky.version_id, rocky.dgx) == ("rocky", "9.4", False)  # quoted ID="rocky" unquoted
    assert rocky.describe() == "Rocky Linux 9.4 (Blue Onyx) (x86_64)"


def test_dgx_os_is_marked_by_dgx_release_with_its_ota_version() -> None:
    dgx = _os("dgx-os-7")
    assert dgx.dgx and dgx.dgx_version == "7.3.1" and dgx.dgx_name == "NVIDIA DGX Server"
    assert dgx.product_name == "DGXH100" and dgx.describe() == "Ubuntu 24.04.1 LTS (DGX OS 7.3.1, x86_64)"
    assert not _os("ubuntu-24.04").dgx


def test_nothing_readable_is_an_unknown_os_not_an_error() -> None:
    empty = parse_os("== os-release\n== dgx-release\n== arch\n== product\n")
    assert (empty.id, empty.dgx, empty.describe()) == ("", False, "an unknown OS")
    assert parse_key_values(['NAME="a b', "# comment", "lower=x", "ID=debian"]) == {"ID": "debian"}


def test_the_command_reads_only_the_dgx_keys_it_needs() -> None:
    command = OsReleaseFact().command()
    assert "/etc/os-release" in command and "uname -m" in command
    assert "SERIAL" not in command and "grep -E '^DGX_(" in command
