"""Debian packages: installed-version, hold and available-version facts, and the AptUpdate, AptPackage and
AptRepo operations."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, ClassVar

from pdfleet.ops.base import Change, Fact, FactSource, Handler, Operation, Run, relabel
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.files import File, FileState, as_bytes

q = shlex.quote

APT_ENV = "DEBIAN_FRONTEND=noninteractive"
APT_INSTALL = (
    f"{APT_ENV} apt-get install -y -q --no-install-recommends --allow-downgrades "
    "--allow-change-held-packages -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold"
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


_POLICY_VERSION = re.compile(r"^(?:\*\*\* )?(\S+) (-?\d+)$")


def parse_apt_policy(stdout: str) -> dict[str, tuple[str, ...]]:
    """The versions apt knows per package (the installed one included) from `apt-cache policy NAME...`:
    each `NAME:` block's version table rows `[***] VERSION PRIORITY`; a name apt cannot find has no block."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_table = False
    for line in stdout.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith(":"):
            current, in_table = out.setdefault(line.rstrip()[:-1], []), False
        elif current is not None and line.strip() == "Version table:":
            in_table = True
        elif current is not None and in_table and (m := _POLICY_VERSION.match(line.strip())):
            current.append(m[1])
    return {name: tuple(versions) for name, versions in out.items()}


@dataclass(frozen=True)
class AptPolicy(Fact[dict[str, tuple[str, ...]]]):
    """The versions of `names` the configured repositories (and dpkg) offer; () for one apt does not know."""

    names: tuple[str, ...]

    def command(self) -> str:
        names = " ".join(shlex.quote(n) for n in self.names)
        return f"LC_ALL=C apt-cache policy {names} 2>/dev/null; true"

    def parse(self, stdout: str, rc: int) -> dict[str, tuple[str, ...]]:
        found = parse_apt_policy(stdout)
        return {name: found.get(name, ()) for name in self.names}


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
class CommandRc(Fact[int]):
    """The exit code of a check command run with sudo (AptUpdate's package-list age test)."""

    cmd: str
    sudo: ClassVar[bool] = True

    def command(self) -> str:
        return self.cmd

    def parse(self, stdout: str, rc: int) -> int:
        return rc


@dataclass(frozen=True)
class AptUpdate(Operation):
    """Package lists refreshed when older than `max_age_minutes` (or never fetched)."""

    max_age_minutes: int = 60

    def describe(self) -> str:
        return "apt-get update"

    def fresh_check(self) -> CommandRc:
        """Exit 0 when some package list is younger than max_age_minutes."""
        return CommandRc(
            "find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' "
            f"-mmin -{self.max_age_minutes} 2>/dev/null | grep -q ."
        )

    def facts(self) -> Iterable[Fact[Any]]:
        return (self.fresh_check(),)

    def plan(self, facts: FactSource) -> list[Change]:
        if facts.get(self.fresh_check()) == 0:
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

    def facts(self) -> Iterable[Fact[Any]]:
        return (AptPackages(), AptHolds()) if self.hold else (AptPackages(),)

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

    def facts(self) -> Iterable[Fact[Any]]:
        keyring = self.keyring_path()
        listed = FileState(f"/etc/apt/sources.list.d/{self.name}.list")
        return (FileState(keyring), listed) if keyring else (listed,)

    def keyring_path(self) -> str | None:
        """Where the signing key lives (armored keys need the .asc suffix for apt)."""
        if self.key is not None:
            armored = as_bytes(self.key).lstrip().startswith(b"-----BEGIN PGP")
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
            changes += File(keyring, as_bytes(self.key), "0644").plan(facts)
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
        return relabel(changes, self.describe())
