"""Shared pieces of the operation tests: file facts as a converged host has them, and a plan's commands."""

from __future__ import annotations

import hashlib

from pdfleet.ops.base import Change, Run, Upload
from pdfleet.ops.files import PathInfo


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
