"""Files and directories: stat/content facts on real outputs and this machine, File and Directory plans."""

from __future__ import annotations

import pytest

from pdfleet.ops.base import FakeFacts
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.files import Directory, DirectoryState, File, FileContent, FileState, PathInfo, parse_stat
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import LocalTransport
from pdfleet.ops.systemd import restart_handler
from tests.unit.ops.helpers import commands, file_info

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_stat_regular_file_with_sha() -> None:
    out = (
        "regular file|644|root|root|1267\n"
        "fbb009546a886aff175d5515b702dd415fbc24bdee63f1ddaf7931c922cb3566  /etc/passwd\n"
    )
    assert parse_stat(out) == PathInfo(
        "file",
        "0644",
        "root",
        "root",
        1267,
        "fbb009546a886aff175d5515b702dd415fbc24bdee63f1ddaf7931c922cb3566",
    )


def test_stat_variants() -> None:
    assert parse_stat("directory|1777|root|root|4096\n") == PathInfo(
        "directory", "1777", "root", "root", 4096
    )
    empty = parse_stat(
        "regular empty file|600|pdfleet|pdfleet|0\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  /etc/x\n"
    )
    assert empty is not None and empty.kind == "file" and empty.mode == "0600" and empty.size == 0
    assert parse_stat("symbolic link|777|root|root|9\n").kind == "link"  # type: ignore[union-attr]
    assert parse_stat("") is None
    with pytest.raises(FactError):
        parse_stat("garbage\n")


def test_file_state_on_this_machine(tmp_path) -> None:
    """The real command and parser agree with Python's view of a file."""
    path = tmp_path / "f.txt"
    path.write_text("hello\n")
    path.chmod(0o640)
    facts = HostFacts(LocalTransport())
    info = facts.get(FileState(str(path)))
    assert info is not None and info.kind == "file" and info.mode == "0640" and info.size == 6
    assert info.sha256 == "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
    assert facts.get(FileState(str(tmp_path / "absent"))) is None
    assert facts.get(FileState(str(tmp_path))).kind == "directory"  # type: ignore[union-attr]
    assert facts.get(FileContent(str(path))) == "hello\n"
    assert facts.get(FileContent(str(path), limit=3)) is None
    assert facts.get(FileContent(str(tmp_path / "absent"))) is None


def test_directory_state_follows_links(tmp_path) -> None:
    real = tmp_path / "data"
    real.mkdir(mode=0o750)
    (tmp_path / "opt").symlink_to(real)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    facts = HostFacts(LocalTransport())
    linked = facts.get(DirectoryState(str(tmp_path / "opt")))
    assert linked is not None and linked.kind == "directory" and linked.mode == "0750"
    assert facts.get(DirectoryState(str(tmp_path / "dangling"))).kind == "link"  # type: ignore[union-attr]
    assert facts.get(DirectoryState(str(tmp_path / "absent"))) is None
    assert facts.get(FileState(str(tmp_path / "opt"))).kind == "link"  # type: ignore[union-attr]


def test_file_converged() -> None:
    facts = FakeFacts({FileState("/etc/a.conf"): file_info("x=1\n")})
    assert File("/etc/a.conf", "x=1\n").plan(facts) == []


def test_file_absent_uploads_with_mode_and_shows_content() -> None:
    facts = FakeFacts({FileState("/etc/a.conf"): None})
    changes = File("/etc/a.conf", "x=1\n", mode="0640", owner="root", group="pdfleet").plan(facts)
    assert commands(changes) == [("/etc/a.conf", "0640", "root", "pdfleet", b"x=1\n")]
    assert "create /etc/a.conf" in changes[0].diff and "+x=1" in changes[0].diff


def test_file_content_drift_gives_unified_diff() -> None:
    facts = FakeFacts({FileState("/etc/a.conf"): file_info("x=1\n"), FileContent("/etc/a.conf"): "x=1\n"})
    notify = (restart_handler("vllm-prefill.service"),)
    changes = File("/etc/a.conf", "x=2\n", notify=notify).plan(facts)
    assert commands(changes) == [("/etc/a.conf", "0644", "root", "root", b"x=2\n")]
    assert "-x=1" in changes[0].diff and "+x=2" in changes[0].diff
    assert changes[0].notify == notify


def test_file_mode_only_drift_is_chmod_chown_only() -> None:
    facts = FakeFacts({FileState("/etc/a.env"): file_info("K=v\n", mode="0644", owner="ops", group="ops")})
    changes = File("/etc/a.env", "K=v\n", mode="0600", secret=True).plan(facts)
    assert commands(changes) == ["chmod 0600 /etc/a.env", "chown root:root /etc/a.env"]
    assert changes[0].diff == "mode 0644 → 0600; owner ops:ops → root:root"


def test_file_secret_never_shows_content() -> None:
    facts = FakeFacts({FileState("/etc/keys.yaml"): file_info("key: old-secret\n", mode="0600")})
    changes = File("/etc/keys.yaml", "key: new-secret\n", mode="0600", secret=True).plan(facts)
    assert changes[0].diff == "content changed (secret, not shown)"
    assert "secret" not in changes[0].diff.replace("(secret, not shown)", "")
    created = File("/etc/k2", "key: s3cr3t\n", mode="0600", secret=True).plan(
        FakeFacts({FileState("/etc/k2"): None})
    )
    assert "s3cr3t" not in created[0].diff and "secret" in created[0].diff


def test_file_large_or_binary_old_content_gives_sha_summary() -> None:
    big = PathInfo("file", "0644", "root", "root", 10_000_000, "a" * 64)
    changes = File("/opt/blob", b"\x00\x01").plan(FakeFacts({FileState("/opt/blob"): big}))
    assert changes[0].diff.startswith("content changed (10000000 → 2 bytes, sha256 aaaaaaaaaaaa → ")


def test_file_where_a_directory_is_fails() -> None:
    facts = FakeFacts({FileState("/etc/x"): PathInfo("directory", "0755", "root", "root", 4096)})
    with pytest.raises(OperationError, match="is a directory"):
        File("/etc/x", "a").plan(facts)


def test_file_where_a_symlink_is_replaces_it() -> None:
    link = PathInfo("link", "0777", "root", "root", 9)
    changes = File("/etc/a.conf", "x=1\n").plan(FakeFacts({FileState("/etc/a.conf"): link}))
    assert commands(changes) == [("/etc/a.conf", "0644", "root", "root", b"x=1\n")]
    assert changes[0].diff.startswith("replace link with file /etc/a.conf (4 bytes, mode 0644, root:root)")
    assert "+x=1" in changes[0].diff


def test_file_rejects_relative_path_and_bad_mode() -> None:
    with pytest.raises(OperationError):
        File("etc/x", "a")
    with pytest.raises(OperationError, match="octal"):
        File("/etc/x", "a", mode="rw-r--r--")


def test_directory() -> None:
    d = Directory("/var/lib/pdfleet", mode="0750", owner="pdfleet", group="pdfleet")
    ok = PathInfo("directory", "0750", "pdfleet", "pdfleet", 4096)
    assert d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): ok})) == []
    assert commands(d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): None}))) == [
        "install -d -m 0750 -o pdfleet -g pdfleet /var/lib/pdfleet"
    ]
    drift = PathInfo("directory", "0755", "root", "root", 4096)
    assert commands(d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): drift}))) == [
        "chmod 0750 /var/lib/pdfleet",
        "chown pdfleet:pdfleet /var/lib/pdfleet",
    ]
    with pytest.raises(OperationError):
        d.plan(FakeFacts({DirectoryState("/var/lib/pdfleet"): file_info("")}))
