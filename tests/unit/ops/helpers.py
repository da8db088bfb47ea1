"""Shared pieces of the operation tests: file facts as a converged host has them, a plan's commands, and
the test sshd as an inventory host."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pdfleet.model.inventory import Host
from pdfleet.ops.base import Change, Run, Upload
from pdfleet.ops.files import PathInfo
from tests.unit.helpers import Sshd


def sha(text: str | bytes) -> str:
    """The hex sha256 FileState reports for this content."""
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def file_info(content: str, mode: str = "0644", owner: str = "root", group: str = "root") -> PathInfo:
    """FileState's value for a regular file holding `content`."""
    return PathInfo("file", mode, owner, group, len(content.encode()), sha(content))


def commands(changes: list[Change]) -> list[object]:
    """Run cmds as strings, uploads as (dest, mode, owner, group, content)."""
    out: list[object] = []
    for change in changes:
        for cmd in change.commands:
            if isinstance(cmd, Run):
                out.append(cmd.cmd)
            else:
                assert isinstance(cmd, Upload)
                out.append((cmd.dest, cmd.mode, cmd.owner, cmd.group, cmd.content))
    return out


def ssh_host(sshd: Sshd, name: str = "loop", port: int | None = None, known: Path | None = None) -> Host:
    """The test sshd as an inventory host: root with the fixture's key and known_hosts (or `known`)."""
    return Host(
        name=name,
        groups=frozenset(),
        vars={},
        address="127.0.0.1",
        port=port or sshd.port,
        user="root",
        key_file=str(sshd.key_file),
        known_hosts_file=str(known or sshd.known_hosts),
    )
