"""Idempotent operations: each compares a desired state with facts and plans the changes to reach it.

A converged host yields no changes. Plans are made from facts gathered before anything is applied,
so an operation whose prerequisite is created earlier in the same run (a venv, a unit file, a
group) plans as if the prerequisite were absent: "create venv + install", "start", "-g group".
"""

from __future__ import annotations

import difflib
import hashlib
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from packaging.requirements import InvalidRequirement, Requirement

from pdfleet.errors import PdfleetError
from pdfleet.ops.base import DAEMON_RELOAD, Change, Command, FactSource, Handler, Operation, Run, Upload
from pdfleet.ops.facts import (
    AptHolds,
    AptPackages,
    CommandRc,
    DirectoryState,
    FileContent,
    FileState,
    GroupInfo,
    LoadedModules,
    PathInfo,
    PipList,
    SysctlValue,
    SystemdUnitState,
    UserGroups,
    UserInfo,
    canonical_pip_name,
    module_name,
    normalize_mode,
    normalize_sysctl,
)

q = shlex.quote

APT_ENV = "DEBIAN_FRONTEND=noninteractive"
APT_INSTALL = (
    f"{APT_ENV} apt-get install -y -q --no-install-recommends --allow-downgrades "
    "--allow-change-held-packages -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
)
DIFF_MAX_LINES = 200
SECRET_NOTE = "content changed (secret, not shown)"


class OperationError(PdfleetError):
    """An operation cannot be planned on this host (e.g. a directory where a file should be)."""


def journal_cmd(unit: str, lines: int = 30) -> str:
    """The diagnostic whose output joins a failed start/restart: the unit's last journal lines."""
    return f"journalctl -u {q(unit)} -n {lines} --no-pager"


def health_wait(unit: str, url: str, timeout: float) -> Run:
    """Wait on the host until `url` answers (curl -fsS), failing early if the unit fails."""
    secs = max(1, int(timeout))
    # unit and url come from the profile/inventory: every use is quoted, the messages too
    failed = q(f"{unit} failed while starting")
    late = q(f"{unit}: {url} did not answer within {secs}s")
    cmd = (
        f"deadline=$(( $(date +%s) + {secs} )); "
        f"until curl -fsS -o /dev/null --max-time 5 {q(url)}; do "
        f"if systemctl is-failed --quiet {q(unit)}; then "
        f"echo {failed} >&2; exit 1; fi; "
        f"if [ $(date +%s) -ge $deadline ]; then "
        f"echo {late} >&2; exit 1; fi; "
        "sleep 2; done"
    )
    return Run(cmd, on_fail=journal_cmd(unit))


def start_cmd(verb: str, unit: str) -> str:
    """`systemctl start|restart` after clearing a failed state: a deliberate (re)start by provision must
    not be refused by StartLimitBurst, which is there to stop crash loops, not operators."""
    return f"systemctl reset-failed {q(unit)} 2>/dev/null; systemctl {verb} {q(unit)}"


def restart_handler(unit: str, health_url: str | None = None, timeout: float = 300) -> Handler:
    """A handler restarting one unit (and waiting for its health URL), run once after the host's changes."""
    commands: list[Command] = [Run(start_cmd("restart", unit), on_fail=journal_cmd(unit))]
    if health_url:
        commands.append(health_wait(unit, health_url, timeout))
    return Handler(f"restart {unit}", tuple(commands), unit=unit)


def _checked_mode(mode: str, path: str) -> str:
    """The mode as four octal digits, or an OperationError naming the path."""
    try:
        return normalize_mode(mode)
    except ValueError as exc:
        raise OperationError(f"{path}: {exc}") from None


def _as_bytes(content: str | bytes) -> bytes:
    return content.encode("utf-8") if isinstance(content, str) else content


def _unified(old: str, new: str, path: str) -> str:
    """A unified diff of two texts, cut at DIFF_MAX_LINES lines."""
    lines = list(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), f"{path} (current)", f"{path}"
        )
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines[:DIFF_MAX_LINES])
    if len(lines) > DIFF_MAX_LINES:
        text += f"... ({len(lines) - DIFF_MAX_LINES} more diff lines)\n"
    return text.rstrip("\n")


def _attr_diff(state: PathInfo, mode: str, owner: str, group: str) -> list[str]:
    """Human lines for mode/owner drift."""
    notes = []
    if state.mode != mode:
        notes.append(f"mode {state.mode} → {mode}")
    if (state.owner, state.group) != (owner, group):
        notes.append(f"owner {state.owner}:{state.group} → {owner}:{group}")
    return notes


@dataclass(frozen=True)
class File(Operation):
    """A regular file with exact content, mode, owner and group (uploaded atomically when it differs)."""

    path: str
    content: str | bytes = field(repr=False)
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    notify: tuple[Handler, ...] = ()
    secret: bool = False
    diff_limit: int = 256 * 1024  # larger files get a sha-only diff

    kind = "file"

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise OperationError(f"{self.kind} path {self.path!r} must be absolute")
        object.__setattr__(self, "mode", _checked_mode(self.mode, self.path))

    def describe(self) -> str:
        return f"{self.kind} {self.path}"

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(FileState(self.path))
        data = _as_bytes(self.content)
        sha = hashlib.sha256(data).hexdigest()
        if state is not None and state.kind == "directory":
            raise OperationError(f"{self.path} is a directory, expected a file")
        if state is None or state.kind != "file" or state.sha256 != sha:
            diff = self._content_diff(facts, state, data, sha)
            upload = Upload(data, self.path, self.mode, self.owner, self.group)
            return [Change(self.describe(), diff, (upload,), self.notify)]
        notes = _attr_diff(state, self.mode, self.owner, self.group)
        commands: list[Command] = []
        if state.mode != self.mode:
            commands.append(Run(f"chmod {self.mode} {q(self.path)}"))
        if (state.owner, state.group) != (self.owner, self.group):
            commands.append(Run(f"chown {q(self.owner)}:{q(self.group)} {q(self.path)}"))
        if not commands:
            return []
        return [Change(self.describe(), "; ".join(notes), tuple(commands), self.notify)]

    def _content_diff(self, facts: FactSource, state: PathInfo | None, data: bytes, sha: str) -> str:
        """The human diff: unified when both sides are readable text and not secret."""
        attrs = f"mode {self.mode}, {self.owner}:{self.group}"
        if state is None or state.kind != "file":
            verb = "create" if state is None else f"replace {state.kind} with file"
            head = f"{verb} {self.path} ({len(data)} bytes, {attrs})"
            if self.secret:
                return f"{head}; content is secret, not shown"
            new_text = _text(data, self.diff_limit)
            return head if new_text is None else head + "\n" + _unified("", new_text, self.path)
        notes = _attr_diff(state, self.mode, self.owner, self.group)
        if self.secret:
            return "; ".join([SECRET_NOTE, *notes])
        old_text = facts.get(FileContent(self.path)) if state.size <= self.diff_limit else None
        new_text = _text(data, self.diff_limit)
        if old_text is None or new_text is None:
            summary = (
                f"content changed ({state.size} → {len(data)} bytes, "
                f"sha256 {(state.sha256 or '?')[:12]} → {sha[:12]})"
            )
            return "; ".join([summary, *notes])
        diff = _unified(old_text, new_text, self.path)
        return "\n".join([*notes, diff]) if notes else diff


def _text(data: bytes, limit: int) -> str | None:
    """Bytes as text for a diff, None when binary or too large."""
    if len(data) > limit:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class Template(File):
    """A file whose content the caller rendered (roles render Jinja2 templates)."""

    kind = "template"


@dataclass(frozen=True)
class Directory(Operation):
    """A directory with mode, owner and group (parents created as needed)."""

    path: str
    mode: str = "0755"
    owner: str = "root"
    group: str = "root"

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise OperationError(f"directory path {self.path!r} must be absolute")
        object.__setattr__(self, "mode", _checked_mode(self.mode, self.path))

    def describe(self) -> str:
        return f"directory {self.path}"

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(DirectoryState(self.path))
        if state is None:
            cmd = f"install -d -m {self.mode} -o {q(self.owner)} -g {q(self.group)} {q(self.path)}"
            diff = f"create {self.path} (mode {self.mode}, {self.owner}:{self.group})"
            return [Change(self.describe(), diff, (Run(cmd),))]
        if state.kind != "directory":
            raise OperationError(f"{self.path} exists and is a {state.kind}, expected a directory")
        commands: list[Command] = []
        if state.mode != self.mode:
            commands.append(Run(f"chmod {self.mode} {q(self.path)}"))
        if (state.owner, state.group) != (self.owner, self.group):
            commands.append(Run(f"chown {q(self.owner)}:{q(self.group)} {q(self.path)}"))
        if not commands:
            return []
        diff = "; ".join(_attr_diff(state, self.mode, self.owner, self.group))
        return [Change(self.describe(), diff, tuple(commands))]


@dataclass(frozen=True)
class LineInFile(Operation):
    """One line present (replacing the last line matching `regexp`) or absent in a text file."""

    path: str
    line: str
    regexp: str | None = None
    present: bool = True
    mode: str = "0644"  # used only when the file is created
    owner: str = "root"
    group: str = "root"
    notify: tuple[Handler, ...] = ()

    def describe(self) -> str:
        return f"line in {self.path}: {self.line}"

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(FileState(self.path))
        if state is None:
            if not self.present:
                return []
            target = File(self.path, self.line + "\n", self.mode, self.owner, self.group, self.notify)
            return _renamed(target.plan(facts), self.describe())
        content = facts.get(FileContent(self.path))
        if content is None:
            raise OperationError(f"{self.path} is not a text file under 256 KiB; cannot edit a line in it")
        new = edit_lines(content, self.line, self.regexp, self.present)
        if new == content:
            return []
        target = File(self.path, new, state.mode, state.owner, state.group, self.notify)
        return _renamed(target.plan(facts), self.describe())


def edit_lines(content: str, line: str, regexp: str | None, present: bool) -> str:
    """The text with `line` ensured present/absent (Ansible lineinfile semantics, last match wins)."""
    lines = content.splitlines()
    pattern = re.compile(regexp) if regexp else None

    def matches(text: str) -> bool:
        return text == line or bool(pattern and pattern.search(text))

    if not present:
        kept = [text for text in lines if not matches(text)]
        if kept == lines:
            return content
        return "".join(text + "\n" for text in kept)
    hits = [i for i, text in enumerate(lines) if pattern and pattern.search(text)]
    if hits:
        if lines[hits[-1]] == line:
            return content
        lines[hits[-1]] = line
    elif line in lines:
        return content
    else:
        lines.append(line)
    return "".join(text + "\n" for text in lines)


def _renamed(changes: list[Change], op: str) -> list[Change]:
    """Changes re-labelled with the composite operation's name."""
    return [Change(op, c.diff, c.commands, c.notify, c.starts_unit, c.flush) for c in changes]


@dataclass(frozen=True)
class AptUpdate(Operation):
    """Package lists refreshed when older than `max_age_minutes` (or never fetched)."""

    max_age_minutes: int = 60

    def describe(self) -> str:
        return "apt-get update"

    def plan(self, facts: FactSource) -> list[Change]:
        fresh = (
            "find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' "
            f"-mmin -{self.max_age_minutes} 2>/dev/null | grep -q ."
        )
        if facts.get(CommandRc(fresh)) == 0:
            return []
        diff = f"package lists older than {self.max_age_minutes} min"
        return [Change(self.describe(), diff, (Run(f"{APT_ENV} apt-get update -q"),))]


@dataclass(frozen=True)
class AptPackage(Operation):
    """A Debian package installed, optionally at a pinned version (glob like `550.*`) and held."""

    name: str
    version: str | None = None
    hold: bool = False  # True: ensure `apt-mark hold`; False: leave the hold state alone
    notify: tuple[Handler, ...] = ()

    def describe(self) -> str:
        pin = f"={self.version}" if self.version else ""
        return f"apt package {self.name}{pin}{' (held)' if self.hold else ''}"

    def plan(self, facts: FactSource) -> list[Change]:
        installed = facts.get(AptPackages()).get(self.name)
        holds = facts.get(AptHolds()) if self.hold else frozenset()
        changes: list[Change] = []
        if installed is None or (self.version and not fnmatchcase(installed, self.version)):
            spec = f"{self.name}={self.version}" if self.version else self.name
            diff = f"install {spec}" if installed is None else f"{self.name} {installed} → {self.version}"
            changes.append(Change(self.describe(), diff, (Run(f"{APT_INSTALL} {q(spec)}"),), self.notify))
        if self.hold and self.name not in holds:
            hold = Run(f"apt-mark hold {q(self.name)}")
            changes.append(Change(self.describe(), f"hold {self.name}", (hold,)))
        return changes


@dataclass(frozen=True)
class AptRepo(Operation):
    """An apt source (one-line .list with signed-by) and its signing key, refreshed on change.

    The key is given as content (armored or binary) or fetched on the host from `key_url` once;
    `trusted=True` (an internal mirror) needs no key. A flat repo has suite "/" and no components.
    """

    name: str
    uri: str
    suite: str
    components: tuple[str, ...] = ("main",)
    key: bytes | str | None = field(default=None, repr=False)
    key_url: str | None = None
    arch: str | None = None
    trusted: bool = False

    def describe(self) -> str:
        return f"apt repo {self.name}"

    def keyring_path(self) -> str | None:
        """Where the signing key lives (armored keys need the .asc suffix for apt)."""
        if self.key is not None:
            armored = _as_bytes(self.key).lstrip().startswith(b"-----BEGIN PGP")
            return f"/etc/apt/keyrings/{self.name}.{'asc' if armored else 'gpg'}"
        if self.key_url:
            ext = "gpg" if self.key_url.endswith(".gpg") else "asc"
            return f"/etc/apt/keyrings/{self.name}.{ext}"
        return None

    def source_line(self) -> str:
        """The one-line source entry."""
        opts = []
        if self.arch:
            opts.append(f"arch={self.arch}")
        keyring = self.keyring_path()
        if self.trusted:
            opts.append("trusted=yes")
        elif keyring:
            opts.append(f"signed-by={keyring}")
        bracket = f"[{' '.join(opts)}] " if opts else ""
        return " ".join(["deb", bracket + self.uri, self.suite, *self.components]).strip() + "\n"

    def plan(self, facts: FactSource) -> list[Change]:
        if not self.trusted and self.key is None and not self.key_url:
            raise OperationError(f"apt repo {self.name}: give key or key_url, or trusted=True for a mirror")
        changes: list[Change] = []
        keyring = self.keyring_path()
        if keyring and self.key is not None:
            changes += File(keyring, _as_bytes(self.key), "0644").plan(facts)
        elif keyring and self.key_url and facts.get(FileState(keyring)) is None:
            fetch = (
                f"install -d -m 0755 /etc/apt/keyrings && curl -fsSL {q(self.key_url)} -o {q(keyring)}.tmp "
                f"&& chmod 0644 {q(keyring)}.tmp && mv -f {q(keyring)}.tmp {q(keyring)}"
            )
            changes.append(Change(self.describe(), f"fetch key {self.key_url} → {keyring}", (Run(fetch),)))
        changes += File(f"/etc/apt/sources.list.d/{self.name}.list", self.source_line()).plan(facts)
        if not changes:
            return []
        changes.append(Change(self.describe(), "apt-get update", (Run(f"{APT_ENV} apt-get update -q"),)))
        return _renamed(changes, self.describe())


@dataclass(frozen=True)
class Sysctl(Operation):
    """A kernel parameter set live and persisted in /etc/sysctl.d."""

    key: str
    value: str | int
    persist: bool = True

    def describe(self) -> str:
        return f"sysctl {self.key}={self.value}"

    def persist_path(self) -> str:
        """One drop-in per key, so keys never fight over a shared file."""
        return f"/etc/sysctl.d/90-pdfleet-{self.key}.conf"

    def plan(self, facts: FactSource) -> list[Change]:
        want = normalize_sysctl(self.value)
        live = facts.get(SysctlValue(self.key))
        changes: list[Change] = []
        if live != want:
            # a key that does not exist yet may appear once a module loads earlier in this run
            before = "absent" if live is None else live
            cmd = f"sysctl -q -w {q(f'{self.key}={want}')}"
            changes.append(Change(self.describe(), f"{self.key}: {before} → {want} (live)", (Run(cmd),)))
        if self.persist:
            changes += File(self.persist_path(), f"{self.key} = {want}\n").plan(facts)
        return _renamed(changes, self.describe())


@dataclass(frozen=True)
class KernelModule(Operation):
    """A kernel module loaded (and at boot) with options, or unloaded (and optionally blacklisted)."""

    name: str
    present: bool = True
    persist: bool = True
    options: str | None = None  # "k=v k2=v2", written to /etc/modprobe.d; applies at next load
    blacklist: bool = False  # with present=False: never auto-load it

    def describe(self) -> str:
        return f"kernel module {self.name}{'' if self.present else ' (absent)'}"

    @property
    def load_path(self) -> str:
        """The modules-load.d file that loads it at boot."""
        return f"/etc/modules-load.d/{self.name}.conf"

    def plan(self, facts: FactSource) -> list[Change]:
        loaded = module_name(self.name) in facts.get(LoadedModules())
        changes: list[Change] = []
        load_path = self.load_path
        if self.present:
            if self.options is not None:
                content = f"options {self.name} {self.options}\n"
                changes += File(f"/etc/modprobe.d/pdfleet-{self.name}.conf", content).plan(facts)
            if not loaded:
                load = Run(f"modprobe {q(self.name)}")
                changes.append(Change(self.describe(), f"load {self.name}", (load,)))
            if self.persist:
                changes += File(load_path, f"{self.name}\n").plan(facts)
        else:
            if loaded:
                cmd = f"modprobe -r {q(self.name)}"
                changes.append(Change(self.describe(), f"unload {self.name}", (Run(cmd),)))
            if facts.get(FileState(load_path)) is not None:
                diff = f"remove {load_path}"
                changes.append(Change(self.describe(), diff, (Run(f"rm -f {q(load_path)}"),)))
            if self.blacklist:
                content = f"blacklist {self.name}\n"
                changes += File(f"/etc/modprobe.d/blacklist-pdfleet-{self.name}.conf", content).plan(facts)
        return _renamed(changes, self.describe())


@dataclass(frozen=True)
class SystemdUnit(Operation):
    """A unit file; a change queues one daemon-reload and the given restart handler."""

    name: str
    content: str | bytes = field(repr=False)
    restart: Handler | None = None
    directory: str = "/etc/systemd/system"

    def describe(self) -> str:
        return f"systemd unit {self.name}"

    def plan(self, facts: FactSource) -> list[Change]:
        notify = (DAEMON_RELOAD,) + ((self.restart,) if self.restart else ())
        target = File(f"{self.directory}/{self.name}", self.content, "0644", notify=notify)
        return _renamed(target.plan(facts), self.describe())


@dataclass(frozen=True)
class Service(Operation):
    """A unit enabled/disabled and running/stopped; a start waits for `health_url` when given."""

    unit: str
    enabled: bool | None = True
    running: bool | None = True
    health_url: str | None = None
    health_timeout: float = 300

    def describe(self) -> str:
        return f"service {self.unit}"

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(SystemdUnitState(self.unit))
        if state.load_state == "masked" and (self.enabled or self.running):
            raise OperationError(f"{self.unit} is masked; unmask it (systemctl unmask {self.unit}) first")
        u = q(self.unit)
        changes: list[Change] = []
        # a unit file written earlier in this run needs the pending daemon-reload before enable/start
        flush = (DAEMON_RELOAD,)
        if self.enabled is True and not state.enabled:
            diff = f"enable {self.unit} (was {state.unit_file_state or state.load_state})"
            changes.append(Change(self.describe(), diff, (Run(f"systemctl enable {u}"),), flush=flush))
        elif self.enabled is False and state.unit_file_state == "enabled":
            changes.append(Change(self.describe(), f"disable {self.unit}", (Run(f"systemctl disable {u}"),)))
        if self.running is True and not state.running:
            commands: list[Command] = [Run(start_cmd("start", self.unit), on_fail=journal_cmd(self.unit))]
            if self.health_url:
                commands.append(health_wait(self.unit, self.health_url, self.health_timeout))
            diff = f"start {self.unit} (was {state.active_state})"
            if self.health_url:
                diff += f", wait for {self.health_url}"
            changes.append(Change(self.describe(), diff, tuple(commands), starts_unit=self.unit, flush=flush))
        elif self.running is False and state.running:
            changes.append(Change(self.describe(), f"stop {self.unit}", (Run(f"systemctl stop {u}"),)))
        return changes


@dataclass(frozen=True)
class Group(Operation):
    """A local group (system group by default)."""

    name: str
    system: bool = True
    gid: int | None = None

    def describe(self) -> str:
        return f"group {self.name}"

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


@dataclass(frozen=True)
class PipRequirements(Operation):
    """Requirements (pins like `vllm==0.8.5`) installed in a venv, created first when missing.

    `index_url`/`extra_index_urls` select a mirror; they must not embed credentials (they appear
    on the host's command line): put authenticated indexes in a secret pip.conf File instead.
    """

    venv: str
    requirements: tuple[str, ...]
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    trusted_host: str | None = None
    find_links: tuple[str, ...] = ()
    python: str = "python3"
    system_site_packages: bool = False
    extra_args: tuple[str, ...] = ()
    notify: tuple[Handler, ...] = ()  # e.g. restarts of the units running from this venv

    def __post_init__(self) -> None:
        reqs = (self.requirements,) if isinstance(self.requirements, str) else tuple(self.requirements)
        object.__setattr__(self, "requirements", reqs)
        object.__setattr__(self, "extra_index_urls", tuple(self.extra_index_urls))
        object.__setattr__(self, "find_links", tuple(self.find_links))
        for req in self.requirements:
            try:
                Requirement(req)
            except InvalidRequirement as exc:
                raise OperationError(f"pip requirement {req!r} for {self.venv} is invalid: {exc}") from exc

    def describe(self) -> str:
        return f"pip in {self.venv}: {', '.join(self.requirements)}"

    def pip_options(self) -> list[str]:
        """Index/mirror options for pip install."""
        opts: list[str] = []
        if self.index_url:
            opts += ["--index-url", q(self.index_url)]
        for url in self.extra_index_urls:
            opts += ["--extra-index-url", q(url)]
        if self.trusted_host:
            opts += ["--trusted-host", q(self.trusted_host)]
        for link in self.find_links:
            opts += ["--find-links", q(link)]
        return opts + [q(a) for a in self.extra_args]

    def plan(self, facts: FactSource) -> list[Change]:
        installed = facts.get(PipList(self.venv))
        changes: list[Change] = []
        if installed is None:
            site = " --system-site-packages" if self.system_site_packages else ""
            cmd = f"{q(self.python)} -m venv{site} {q(self.venv)}"
            changes.append(Change(self.describe(), f"create venv {self.venv}", (Run(cmd),)))
            installed = {}
        missing = unmet_requirements(self.requirements, installed)
        if missing:
            lines = [f"install into {self.venv}:"]
            for req, have in missing:
                lines.append(f"  + {req}" + (f" (have {have})" if have else ""))
            pip = f"{q(self.venv.rstrip('/') + '/bin/python')} -m pip install --disable-pip-version-check -q"
            cmd = " ".join([pip, *self.pip_options(), *(q(r) for r, _ in missing)])
            changes.append(Change(self.describe(), "\n".join(lines), (Run(cmd),), self.notify))
        return changes


def unmet_requirements(
    requirements: Iterable[str], installed: dict[str, str]
) -> list[tuple[str, str | None]]:
    """(requirement, installed version or None) for each requirement the venv does not satisfy."""
    unmet: list[tuple[str, str | None]] = []
    for text in requirements:
        req = Requirement(text)
        have = installed.get(canonical_pip_name(req.name))
        if have is None:
            unmet.append((text, None))
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append((text, have))
    return unmet


@dataclass(frozen=True)
class CommandOp(Operation):
    """A command run only when `creates` does not exist and `unless` fails.

    Without either guard it runs on every apply (never converged), so roles should always give one.
    """

    cmd: str
    creates: str | None = None
    unless: str | None = None
    name: str | None = None
    sudo: bool = True
    notify: tuple[Handler, ...] = ()

    def describe(self) -> str:
        return f"command {self.name or self.cmd}"

    def plan(self, facts: FactSource) -> list[Change]:
        if self.creates and facts.get(DirectoryState(self.creates)) is not None:
            return []
        if self.unless and facts.get(CommandRc(self.unless)) == 0:
            return []
        why = f" ({self.creates} missing)" if self.creates else ""
        run = Run(self.cmd, sudo=self.sudo)
        return [Change(self.describe(), f"run: {self.cmd}{why}", (run,), self.notify)]
