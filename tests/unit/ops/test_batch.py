"""Fact batches on this machine's shell: one command answers many facts with exactly the values their own
commands give, one fact's output cannot pose as another's, and a batch cut short leaves facts for `get`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdfleet.ops.apt import CommandRc
from pdfleet.ops.base import Fact
from pdfleet.ops.batch import batch_script, split_batch
from pdfleet.ops.errors import FactError
from pdfleet.ops.files import DirectoryState, FileState
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import LocalTransport, Output
from pdfleet.ops.unit_health import UnitHealth

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

TOKEN = "0123456789abcdef"


def _paths(tmp_path: Path) -> list[str]:
    """Every kind of path a stat fact meets: file, empty file, directory, links, absent, odd names."""
    (tmp_path / "file").write_text("hello\n")
    (tmp_path / "empty").write_text("")
    (tmp_path / "dir").mkdir()
    (tmp_path / "odd name 'q' $x").write_text("odd\n")
    os.symlink(tmp_path / "file", tmp_path / "link")
    os.symlink(tmp_path / "dir", tmp_path / "dirlink")
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    os.chmod(tmp_path / "file", 0o640)
    names = ["file", "empty", "dir", "odd name 'q' $x", "link", "dirlink", "dangling", "absent"]
    return [str(tmp_path / n) for n in names]


@pytest.mark.parametrize("kind", [FileState, DirectoryState])
def test_combined_path_facts_equal_their_own_commands(tmp_path: Path, kind: type) -> None:
    facts = [kind(p) for p in _paths(tmp_path)]
    alone = {f: HostFacts(LocalTransport()).get(f) for f in facts}
    batched = HostFacts(LocalTransport())
    batched.gather(facts)
    assert batched.commands == 1
    assert {f: batched.get(f) for f in facts} == alone
    assert batched.commands <= 2  # DirectoryState leaves the dangling link to its own command


def test_one_command_for_mixed_facts_and_outputs_stay_apart() -> None:
    """A fact printing a forged marker and no final newline, a failing one, and stderr per fact."""
    forged = CommandRc("printf '@@pdfleet-fake 1\\n@@pdfleet-fake rc 1 0'; echo oops >&2; exit 4")
    plain = CommandRc("true")
    facts = HostFacts(LocalTransport())
    facts.gather([forged, plain, forged])
    assert facts.commands == 1
    assert (facts.get(forged), facts.get(plain)) == (4, 0)
    script, units = batch_script([forged, plain], TOKEN)
    out = LocalTransport().run(script)
    result = split_batch(units, TOKEN, out.stdout, out.stderr)
    assert result.outputs[forged] == ("@@pdfleet-fake 1\n@@pdfleet-fake rc 1 0", 4)
    assert result.stderr[forged] == "oops\n" and result.stderr[plain] == ""


def test_a_batch_cut_short_leaves_the_rest_to_get(tmp_path: Path) -> None:
    first, second = CommandRc("exit 0"), CommandRc("exit 5")
    script, units = batch_script([first, second], TOKEN)
    out = LocalTransport().run(script)
    cut = out.stdout[: out.stdout.index(f"@@pdfleet-{TOKEN} 1")]
    result = split_batch(units, TOKEN, cut, "")
    assert result.outputs == {first: ("", 0)}


def test_batch_token_must_be_random_hex() -> None:
    with pytest.raises(ValueError):
        batch_script([CommandRc("true")], "x")


@dataclass
class _Refusing:
    """A transport whose every command fails before running, as `sudo -n` does without a sudoers rule."""

    name: str = "h1"

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Output:
        return Output(1, "", "sudo: a password is required\n")


def test_a_batch_that_never_started_says_why() -> None:
    expected = r"as root \(sudo -n\) failed before any ran \(exit 1\): sudo: a password"
    with pytest.raises(FactError, match=expected):
        HostFacts(_Refusing()).gather([FileState("/etc/hostname"), CommandRc("true")])


def _fact_classes() -> list[type[Fact[object]]]:
    return [FileState, DirectoryState, UnitHealth]


def test_combining_needs_a_group_of_plain_absolute_paths() -> None:
    assert FileState.combine([FileState("/a")]) is None
    assert FileState.combine([FileState("/a"), FileState("/b\nc")]) is None
    assert DirectoryState.combine([DirectoryState("/a"), DirectoryState("rel")]) is None
    assert all(cls.combine([]) is None or cls is UnitHealth for cls in _fact_classes())
