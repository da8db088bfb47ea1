"""Generic facts: a shell command plus a pure parser, gathered once per host per run.

Each fact is a frozen dataclass whose fields are its arguments, so an instance is its own cache
key. Parsers are module-level pure functions so they can be tested on sample outputs.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from pdfleet.ops.base import Fact

T = TypeVar("T")


class FactError(Exception):
    """A fact's command output could not be understood (the host is not what the op expects)."""


# --- value types ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PathInfo:
    """What `stat` says about a path; `sha256` only for regular files."""

    kind: str  # "file", "directory", "link", "other"
    mode: str  # four octal digits, e.g. "0644"
    owner: str
    group: str
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class UnitState:
    """The parts of `systemctl show` that service operations compare."""

    load_state: str  # loaded / not-found / masked ...
    active_state: str  # active / inactive / failed / activating ...
    sub_state: str
    unit_file_state: str  # enabled / disabled / static / masked / "" ...

    @property
    def exists(self) -> bool:
        """Whether systemd knows a unit file for it."""
        return self.load_state not in ("not-found", "")

    @property
    def enabled(self) -> bool:
        """Whether it starts at boot (static/alias units count: they cannot be enabled)."""
        return self.unit_file_state in ("enabled", "enabled-runtime", "static", "alias", "indirect")

    @property
    def running(self) -> bool:
        """Whether it is up or on its way up."""
        return self.active_state in ("active", "activating", "reloading")


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


# --- pure parsers --------------------------------------------------------------------------------

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


def parse_dpkg_query(stdout: str) -> dict[str, str]:
    """Installed packages from `dpkg-query -W -f '${Package}\\t${db:Status-Abbrev}\\t${Version}\\n'`.

    Only fully installed packages count ("ii"/"hi"); removed-but-configured ("rc") ones do not.
    """
    installed: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, status, version = (p.strip() for p in parts)
        # db:Status-Abbrev is want/state/error, e.g. "ii " or "hi "; state "i" = installed
        if len(status) >= 2 and status[1] == "i" and version:
            installed[name.split(":")[0]] = version
    return installed


def parse_lines(stdout: str) -> frozenset[str]:
    """The non-empty stripped lines of the output, e.g. `apt-mark showhold`."""
    return frozenset(line.strip() for line in stdout.splitlines() if line.strip())


def parse_systemctl_show(stdout: str) -> UnitState:
    """Parse `systemctl show -p LoadState -p ActiveState -p SubState -p UnitFileState UNIT`."""
    props: dict[str, str] = {}
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    if "LoadState" not in props or "ActiveState" not in props:
        raise FactError(f"unexpected systemctl show output: {stdout.strip()[:200]!r}")
    return UnitState(
        load_state=props["LoadState"],
        active_state=props["ActiveState"],
        sub_state=props.get("SubState", ""),
        unit_file_state=props.get("UnitFileState", ""),
    )


def normalize_sysctl(value: str | int) -> str:
    """A sysctl value with runs of whitespace (the kernel prints tabs) collapsed to one space."""
    return " ".join(str(value).split())


def parse_sysctl(stdout: str, rc: int) -> str | None:
    """`sysctl -n KEY`: the normalized value, or None when the key does not exist."""
    if rc != 0:
        return None
    return normalize_sysctl(stdout)


def module_name(name: str) -> str:
    """The kernel's spelling of a module name: modprobe accepts dashes, /proc/modules shows underscores."""
    return name.strip().replace("-", "_")


def parse_proc_modules(stdout: str) -> frozenset[str]:
    """Loaded module names from /proc/modules (first column)."""
    return frozenset(module_name(line.split()[0]) for line in stdout.splitlines() if line.strip())


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


def canonical_pip_name(name: str) -> str:
    """PEP 503 normalized project name, so `Foo_Bar` and `foo-bar` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pip_list_json(stdout: str) -> dict[str, str]:
    """`pip list --format=json` → {canonical name: version}."""
    try:
        rows = json.loads(stdout or "[]")
    except json.JSONDecodeError as exc:
        raise FactError(f"pip list did not print JSON: {stdout.strip()[:200]!r}") from exc
    return {canonical_pip_name(row["name"]): str(row["version"]) for row in rows}


# --- facts ---------------------------------------------------------------------------------------

_STAT = "stat -c '%F|%a|%U|%G|%s' -- {p}"


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


@dataclass(frozen=True)
class AptPackages(Fact[dict[str, str | None]]):
    """Installed versions: of `names` (None when not installed), or of every package when empty."""

    names: tuple[str, ...] = ()

    def command(self) -> str:
        fmt = shlex.quote("${Package}\t${db:Status-Abbrev}\t${Version}\n")
        names = " ".join(shlex.quote(n) for n in self.names)
        # dpkg-query exits 1 when one name is unknown but still prints the known ones
        return f"dpkg-query -W -f {fmt} {names} 2>/dev/null; true"

    def parse(self, stdout: str, rc: int) -> dict[str, str | None]:
        installed: dict[str, str | None] = dict(parse_dpkg_query(stdout))
        if self.names:
            return {n: installed.get(n) for n in self.names}
        return installed


@dataclass(frozen=True)
class AptHolds(Fact[frozenset[str]]):
    """Packages marked hold (`apt-mark showhold`)."""

    def command(self) -> str:
        return "apt-mark showhold"

    def parse(self, stdout: str, rc: int) -> frozenset[str]:
        if rc != 0:
            raise FactError(f"apt-mark showhold failed (exit {rc})")
        return frozenset(n.split(":")[0] for n in parse_lines(stdout))


@dataclass(frozen=True)
class SystemdUnitState(Fact[UnitState]):
    """A unit's load/active/sub/unit-file state."""

    unit: str

    def command(self) -> str:
        return (
            "systemctl show -p LoadState -p ActiveState -p SubState -p UnitFileState "
            f"-- {shlex.quote(self.unit)}"
        )

    def parse(self, stdout: str, rc: int) -> UnitState:
        if rc != 0:
            raise FactError(f"systemctl show {self.unit} failed (exit {rc}); is systemd running?")
        return parse_systemctl_show(stdout)


@dataclass(frozen=True)
class SysctlValue(Fact[str | None]):
    """A kernel parameter's live value (whitespace-normalized), None when the key does not exist."""

    key: str

    def command(self) -> str:
        return f"sysctl -n -- {shlex.quote(self.key)}"

    def parse(self, stdout: str, rc: int) -> str | None:
        return parse_sysctl(stdout, rc)


@dataclass(frozen=True)
class LoadedModules(Fact[frozenset[str]]):
    """Names of loaded kernel modules (underscore spelling); empty on a kernel without module support."""

    def command(self) -> str:
        # containers and monolithic kernels have no /proc/modules: nothing is loaded as a module
        return "[ -e /proc/modules ] || exit 0; cat /proc/modules"

    def parse(self, stdout: str, rc: int) -> frozenset[str]:
        if rc != 0:
            raise FactError(f"cannot read /proc/modules (exit {rc})")
        return parse_proc_modules(stdout)


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
class PipList(Fact[dict[str, str] | None]):
    """Distributions installed in a venv {canonical name: version}; None when the venv has no python."""

    venv: str

    def command(self) -> str:
        py = shlex.quote(f"{self.venv.rstrip('/')}/bin/python")
        return (
            f"[ -x {py} ] || exit 3; "
            f"{py} -m pip list --format=json --disable-pip-version-check --no-input 2>/dev/null"
        )

    def parse(self, stdout: str, rc: int) -> dict[str, str] | None:
        if rc == 3:
            return None
        if rc != 0:
            raise FactError(f"pip list in {self.venv} failed (exit {rc}); is pip installed in the venv?")
        return parse_pip_list_json(stdout)


@dataclass(frozen=True)
class CommandRc(Fact[int]):
    """The exit code of a check command run with sudo (e.g. a CommandOp's `unless`)."""

    cmd: str
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        return self.cmd

    def parse(self, stdout: str, rc: int) -> int:
        return rc


class CommandRunner(Protocol):
    """What HostFacts needs from a transport."""

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Any:
        """Run a command; the result has `rc`, `stdout`, `stderr`."""
        ...


class HostFacts:
    """A host's facts, gathered lazily: one command per distinct fact per run, then cached."""

    def __init__(self, conn: CommandRunner, timeout: float | None = 120) -> None:
        self._conn = conn
        self._timeout = timeout
        self._cache: dict[Fact[Any], Any] = {}
        self._lock = threading.Lock()

    def get(self, fact: Fact[T]) -> T:
        """The fact's value, running its command on first use."""
        with self._lock:
            if fact in self._cache:
                return self._cache[fact]  # type: ignore[no-any-return]
            out = self._conn.run(fact.command(), sudo=fact.sudo, timeout=self._timeout)
            try:
                value = fact.parse(out.stdout, out.rc)
            except FactError as exc:
                detail = out.stderr.strip().splitlines()[-3:] if out.stderr else []
                raise FactError(" ".join([str(exc), *detail])) from None
            self._cache[fact] = value
            return value

    @property
    def gathered(self) -> int:
        """How many distinct facts were gathered (one SSH round trip each)."""
        return len(self._cache)
