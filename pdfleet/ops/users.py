"""Local users and groups: the passwd, group and membership facts, and the Group and User operations."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pdfleet.ops.base import Change, Fact, FactSource, Operation, Run
from pdfleet.ops.errors import FactError

q = shlex.quote


@dataclass(frozen=True)
class PasswdEntry:
    """One `getent passwd` line."""

    name: str
    uid: int
    gid: int
    gecos: str
    home: str
    shell: str


@dataclass(frozen=True)
class GroupEntry:
    """One `getent group` line."""

    name: str
    gid: int
    members: tuple[str, ...]


def parse_getent_passwd(stdout: str, rc: int) -> PasswdEntry | None:
    """`getent passwd NAME` → the entry, or None when the user does not exist (rc 2)."""
    line = stdout.strip().splitlines()[0] if rc == 0 and stdout.strip() else ""
    if not line:
        return None
    parts = line.split(":")
    if len(parts) != 7:
        raise FactError(f"unexpected getent passwd output: {line!r}")
    name, _pw, uid, gid, gecos, home, shell = parts
    return PasswdEntry(name, int(uid), int(gid), gecos, home, shell)


def parse_getent_group(stdout: str, rc: int) -> GroupEntry | None:
    """`getent group NAME` → the entry, or None when the group does not exist."""
    line = stdout.strip().splitlines()[0] if rc == 0 and stdout.strip() else ""
    if not line:
        return None
    parts = line.split(":")
    if len(parts) != 4:
        raise FactError(f"unexpected getent group output: {line!r}")
    name, _pw, gid, members = parts
    return GroupEntry(name, int(gid), tuple(m for m in members.split(",") if m))


@dataclass(frozen=True)
class UserInfo(Fact[PasswdEntry | None]):
    """The passwd entry of a user, None when absent."""

    name: str

    def command(self) -> str:
        return f"getent passwd -- {shlex.quote(self.name)}"

    def parse(self, stdout: str, rc: int) -> PasswdEntry | None:
        return parse_getent_passwd(stdout, rc)


@dataclass(frozen=True)
class GroupInfo(Fact[GroupEntry | None]):
    """The group entry of a group, None when absent."""

    name: str

    def command(self) -> str:
        return f"getent group -- {shlex.quote(self.name)}"

    def parse(self, stdout: str, rc: int) -> GroupEntry | None:
        return parse_getent_group(stdout, rc)


@dataclass(frozen=True)
class UserGroups(Fact[frozenset[str] | None]):
    """All group names a user is in (`id -nG`), None when the user does not exist."""

    name: str

    def command(self) -> str:
        return f"id -nG -- {shlex.quote(self.name)}"

    def parse(self, stdout: str, rc: int) -> frozenset[str] | None:
        return frozenset(stdout.split()) if rc == 0 else None


@dataclass(frozen=True)
class Group(Operation):
    """A local group (system group by default)."""

    name: str
    system: bool = True
    gid: int | None = None

    def describe(self) -> str:
        return f"group {self.name}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (GroupInfo(self.name),)

    def plan(self, facts: FactSource) -> list[Change]:
        entry = facts.get(GroupInfo(self.name))
        if entry is None:
            args = ["groupadd"] + (["--system"] if self.system else [])
            args += ["--gid", str(self.gid)] if self.gid is not None else []
            add = Run(" ".join([*args, q(self.name)]))
            return [Change(self.describe(), f"create group {self.name}", (add,))]
        if self.gid is not None and entry.gid != self.gid:
            cmd = f"groupmod --gid {self.gid} {q(self.name)}"
            return [Change(self.describe(), f"gid {entry.gid} → {self.gid}", (Run(cmd),))]
        return []


@dataclass(frozen=True)
class User(Operation):
    """A local user (system user, no login by default) with primary and supplementary groups."""

    name: str
    system: bool = True
    home: str | None = None
    shell: str = "/usr/sbin/nologin"
    group: str | None = None  # primary group; None: a group named like the user
    groups: tuple[str, ...] = ()  # supplementary groups the user must be in (others are left alone)
    create_home: bool = False

    def describe(self) -> str:
        return f"user {self.name}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (UserInfo(self.name), GroupInfo(self.group or self.name), UserGroups(self.name))

    def plan(self, facts: FactSource) -> list[Change]:
        entry = facts.get(UserInfo(self.name))
        primary = self.group or self.name
        primary_info = facts.get(GroupInfo(primary))
        if entry is None:
            return [Change(self.describe(), self._create_diff(), (Run(self._useradd(primary_info is None)),))]
        args: list[str] = []
        notes: list[str] = []
        if entry.shell != self.shell:
            args += ["--shell", q(self.shell)]
            notes.append(f"shell {entry.shell} → {self.shell}")
        if self.home and entry.home != self.home:
            args += ["--home", q(self.home)]
            notes.append(f"home {entry.home} → {self.home}")
        if primary_info is None or primary_info.gid != entry.gid:
            args += ["--gid", q(primary)]
            notes.append(f"primary group → {primary}")
        have = facts.get(UserGroups(self.name)) or frozenset()
        missing = [g for g in self.groups if g not in have]
        if missing:
            args += ["--append", "--groups", q(",".join(missing))]
            notes.append(f"add to groups {','.join(missing)}")
        if not args:
            return []
        cmd = " ".join(["usermod", *args, q(self.name)])
        return [Change(self.describe(), "; ".join(notes), (Run(cmd),))]

    def _create_diff(self) -> str:
        groups = f", groups {','.join(self.groups)}" if self.groups else ""
        return f"create user {self.name} (shell {self.shell}{groups})"

    def _useradd(self, group_missing: bool) -> str:
        args = ["useradd"] + (["--system"] if self.system else [])
        if self.home:
            args += ["--home-dir", q(self.home)]
        args.append("--create-home" if self.create_home else "--no-create-home")
        args += ["--shell", q(self.shell)]
        if self.group is None and group_missing:
            args.append("--user-group")
        else:
            args += ["--gid", q(self.group or self.name)]
        if self.groups:
            args += ["--groups", q(",".join(self.groups))]
        return " ".join([*args, q(self.name)])
