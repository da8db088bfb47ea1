"""Files and directories: the stat/content facts and the File and Directory operations.

A file's content is uploaded atomically when its sha256 differs; mode and owner drift alone is
repaired with chmod/chown. Diffs are unified text unless the content is secret, binary or large.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pdfleet.ops.base import (
    Change,
    Combined,
    Command,
    Fact,
    FactSource,
    Handler,
    Operation,
    RawOutput,
    Run,
    Upload,
)
from pdfleet.ops.diff import as_text, unified
from pdfleet.ops.errors import FactError, OperationError

q = shlex.quote

SECRET_NOTE = "content changed (secret, not shown)"


@dataclass(frozen=True)
class PathInfo:
    """What `stat` says about a path; `sha256` only for regular files."""

    kind: str  # "file", "directory", "link", "other"
    mode: str  # four octal digits, e.g. "0644"
    owner: str
    group: str
    size: int
    sha256: str | None = None


_STAT_KINDS = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "directory",
    "symbolic link": "link",
}


def normalize_mode(mode: str | int) -> str:
    """A mode as four octal digits ("644" → "0644", 0o600 → "0600")."""
    if isinstance(mode, int):
        return f"{mode:04o}"
    text = mode.strip()
    if not re.fullmatch(r"[0-7]{3,4}", text):
        raise ValueError(f"mode {mode!r} is not an octal mode like 0644")
    return text.rjust(4, "0")


def parse_stat(stdout: str) -> PathInfo | None:
    """Parse `stat -c '%F|%a|%U|%G|%s'` optionally followed by a `sha256sum` line; "" → None."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    parts = lines[0].split("|")
    if len(parts) != 5:
        raise FactError(f"unexpected stat output: {lines[0]!r}")
    ftype, mode, owner, group, size = parts
    sha = None
    if len(lines) > 1:
        sha = lines[1].split()[0].lstrip("\\")
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise FactError(f"unexpected sha256sum output: {lines[1]!r}")
    return PathInfo(
        kind=_STAT_KINDS.get(ftype, "other"),
        mode=normalize_mode(mode),
        owner=owner,
        group=group,
        size=int(size),
        sha256=sha,
    )


_STAT = "stat -c '%F|%a|%U|%G|%s' -- {p}"
_STAT_NAMED = "stat -c '%n|%F|%a|%U|%G|%s'"


def _combinable(path: str) -> bool:
    """Whether a path prints as itself in `stat %n` and `sha256sum` lines (no newline, no backslash)."""
    return path.startswith("/") and "\n" not in path and "\\" not in path


def _path_lists(paths: Sequence[str], follow: bool) -> str:
    """Shell printing `e|PATH` for paths that exist, `f|PATH` for regular files, `l|PATH` for dangling
    links (printf and test are builtins: no process per path), then one stat for all that exist."""
    words = " ".join(shlex.quote(p) for p in paths)
    exists = '[ -e "$p" ]' if follow else '[ -e "$p" ] || [ -L "$p" ]'
    stat = _STAT_NAMED.replace("stat ", "stat -L ", 1) if follow else _STAT_NAMED
    return (
        f'set --; for p in {words}; do if {exists}; then printf "e|%s\\n" "$p"; set -- "$@" "$p"; '
        + ('elif [ -L "$p" ]; then printf "l|%s\\n" "$p"; ' if follow else "")
        + 'fi; if [ -f "$p" ] && [ ! -L "$p" ]; then printf "f|%s\\n" "$p"; fi; done; '
        + f'if [ $# -gt 0 ]; then {stat} -- "$@"; fi'
    )


SHA_MARK = "@@sha256"


def _split_stats(stdout: str) -> tuple[dict[str, set[str]], dict[str, str], dict[str, str]]:
    """Of a combined path command's output, by path: the e/f/l flags, the stat line without the name,
    and the sha256 (lines after SHA_MARK)."""
    flags: dict[str, set[str]] = {}
    stats: dict[str, str] = {}
    shas: dict[str, str] = {}
    in_shas = False
    for line in stdout.splitlines():
        if line == SHA_MARK:
            in_shas = True
        elif in_shas:
            digest, _, name = line.partition("  ")
            shas[name] = digest
        elif line[:2] in ("e|", "f|", "l|"):
            flags.setdefault(line[2:], set()).add(line[0])
        elif line.count("|") >= 5:
            name, *rest = line.rsplit("|", 5)
            stats[name] = "|".join(rest)
    return flags, stats, shas


@dataclass(frozen=True)
class FileState(Fact[PathInfo | None]):
    """A path's kind, mode, owner, group, size and (regular files) sha256; None when absent."""

    path: str
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        p = shlex.quote(self.path)
        return (
            f"if [ -e {p} ] || [ -L {p} ]; then {_STAT.format(p=p)} || exit 1; "
            f"if [ -f {p} ] && [ ! -L {p} ]; then sha256sum -- {p} || exit 1; fi; fi"
        )

    def parse(self, stdout: str, rc: int) -> PathInfo | None:
        if rc != 0:
            raise FactError(f"cannot stat {self.path} (exit {rc})")
        return parse_stat(stdout)

    @classmethod
    def combine(cls, facts: Sequence[Fact[Any]]) -> Combined | None:
        """One stat for every path and one sha256sum for every regular file among them."""
        paths = [f.path for f in facts if isinstance(f, FileState) and _combinable(f.path)]
        if len(paths) < 2 or len(paths) != len(facts):
            return None
        command = (
            _path_lists(paths, follow=False)
            + "; set --; for p in "
            + " ".join(shlex.quote(p) for p in paths)
            + '; do if [ -f "$p" ] && [ ! -L "$p" ]; then set -- "$@" "$p"; fi; done; '
            + f'echo {SHA_MARK}; if [ $# -gt 0 ]; then sha256sum -- "$@"; fi'
        )

        def split(stdout: str, rc: int) -> dict[Fact[Any], RawOutput]:
            flags, stats, shas = _split_stats(stdout)
            out: dict[Fact[Any], RawOutput] = {}
            for fact in facts:
                assert isinstance(fact, FileState)
                have = flags.get(fact.path, set())
                line, digest = stats.get(fact.path), shas.get(fact.path)
                if "e" not in have:
                    out[fact] = ("", 0)
                elif line is None or ("f" in have and digest is None):
                    out[fact] = ("", 1)  # it exists but stat or sha256sum failed on it
                else:
                    out[fact] = (line + "\n" + (f"{digest}  {fact.path}\n" if "f" in have else ""), 0)
            return out

        return Combined(command, split)


@dataclass(frozen=True)
class DirectoryState(Fact[PathInfo | None]):
    """A path's kind, mode, owner and group, without hashing; None when absent.

    Symlinks are followed (a directory may be a link to another disk); a dangling link is a "link".
    """

    path: str
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        p = shlex.quote(self.path)
        stat_l = _STAT.replace("stat ", "stat -L ", 1)
        return f"if [ -e {p} ]; then {stat_l.format(p=p)}; elif [ -L {p} ]; then {_STAT.format(p=p)}; fi"

    def parse(self, stdout: str, rc: int) -> PathInfo | None:
        if rc != 0:
            raise FactError(f"cannot stat {self.path} (exit {rc})")
        return parse_stat(stdout)

    @classmethod
    def combine(cls, facts: Sequence[Fact[Any]]) -> Combined | None:
        """One `stat -L` for every existing path (a dangling link gets its own plain stat)."""
        paths = [f.path for f in facts if isinstance(f, DirectoryState) and _combinable(f.path)]
        if len(paths) < 2 or len(paths) != len(facts):
            return None

        def split(stdout: str, rc: int) -> dict[Fact[Any], RawOutput]:
            flags, stats, _ = _split_stats(stdout)
            out: dict[Fact[Any], RawOutput] = {}
            for fact in facts:
                assert isinstance(fact, DirectoryState)
                have = flags.get(fact.path, set())
                if "l" in have:
                    continue  # a dangling link: left to its own command (`get`), which stats the link
                if "e" in have:
                    line = stats.get(fact.path, "")
                    out[fact] = (line + "\n", 0 if line else 1)
                else:
                    out[fact] = ("", 0)
            return out

        return Combined(_path_lists(paths, follow=True), split)


@dataclass(frozen=True)
class FileContent(Fact[str | None]):
    """A text file's content for diffs; None when absent, larger than `limit` bytes, or not UTF-8.

    Never gather this for files that hold secrets: its value may be shown to the operator.
    """

    path: str
    limit: int = 256 * 1024
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        p = shlex.quote(self.path)
        # one byte over the limit tells "exactly limit" from "too big"
        return f"if [ -f {p} ]; then head -c {self.limit + 1} -- {p}; else exit 3; fi"

    def parse(self, stdout: str, rc: int) -> str | None:
        if rc == 3:
            return None
        if rc != 0:
            raise FactError(f"cannot read {self.path} (exit {rc})")
        if len(stdout.encode("utf-8", "surrogateescape")) > self.limit or "\ufffd" in stdout:
            return None
        return stdout


def _checked_mode(mode: str, path: str) -> str:
    """The mode as four octal digits, or an OperationError naming the path."""
    try:
        return normalize_mode(mode)
    except ValueError as exc:
        raise OperationError(f"{path}: {exc}") from None


def as_bytes(content: str | bytes) -> bytes:
    """Content as the bytes uploaded (str is UTF-8)."""
    return content.encode("utf-8") if isinstance(content, str) else content


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

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise OperationError(f"file path {self.path!r} must be absolute")
        object.__setattr__(self, "mode", _checked_mode(self.mode, self.path))

    def describe(self) -> str:
        return f"file {self.path}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (FileState(self.path),)

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(FileState(self.path))
        data = as_bytes(self.content)
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
            new_text = as_text(data, self.diff_limit)
            return head if new_text is None else head + "\n" + unified("", new_text, self.path)
        notes = _attr_diff(state, self.mode, self.owner, self.group)
        if self.secret:
            return "; ".join([SECRET_NOTE, *notes])
        old_text = facts.get(FileContent(self.path)) if state.size <= self.diff_limit else None
        new_text = as_text(data, self.diff_limit)
        if old_text is None or new_text is None:
            summary = (
                f"content changed ({state.size} → {len(data)} bytes, "
                f"sha256 {(state.sha256 or '?')[:12]} → {sha[:12]})"
            )
            return "; ".join([summary, *notes])
        diff = unified(old_text, new_text, self.path)
        return "\n".join([*notes, diff]) if notes else diff


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

    def facts(self) -> Iterable[Fact[Any]]:
        return (DirectoryState(self.path),)

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
