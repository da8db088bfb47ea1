"""The ops engine's vocabulary, pyinfra's model on Fabric.

A *fact* is a command plus a parser. An *operation* states a desired state and, given facts,
plans the *changes* (commands, uploads and pushes, each with a human diff) that reach it: none when the
host is converged. Changes may notify *handlers* (daemon-reload, restart of one unit), which the
runner runs once per host after the host's changes, daemon-reload first.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)  # a Fact[X] is a Fact[X | None]: its value only comes out


@dataclass(frozen=True)
class Watch:
    """A file on the host that grows while a long command runs (a download's `.part`): the runner reports
    its size against `total` (bytes, rate, ETA) under `label` while the command runs; `start` is what it
    held before (a continued download's rate counts only the new bytes)."""

    path: str
    total: int
    label: str
    start: int = 0


@dataclass(frozen=True)
class Run:
    """A shell command on the host; `on_fail` is a diagnostic command whose output joins the error."""

    cmd: str
    sudo: bool = True
    on_fail: str | None = None
    watch: Watch | None = None


@dataclass(frozen=True)
class Push:
    """A file on the control machine (`source`, `size` bytes) appended to `dest` on the host from the size
    `dest` already has, so an interrupted push continues; streamed over the host's SSH connection in
    chunks (never whole in memory), at most `limit` bytes per second, with progress under `label`."""

    source: str
    dest: str
    size: int
    label: str
    limit: int | None = None


@dataclass(frozen=True)
class Upload:
    """Content put at `dest` atomically: upload to a temp path, then `install -m -o -g` into place."""

    content: bytes = field(repr=False)
    dest: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"


Command = Run | Upload | Push


@dataclass(frozen=True)
class Handler:
    """Commands run at most once per host after its changes, e.g. a unit restart."""

    name: str
    commands: tuple[Command, ...]
    unit: str | None = None  # the unit it restarts, so a unit started in this run is not restarted again


DAEMON_RELOAD = Handler("daemon-reload", (Run("systemctl daemon-reload"),))


@dataclass(frozen=True)
class Change:
    """One step towards the desired state: what, a human diff (secrets redacted), and how."""

    op: str
    diff: str
    commands: tuple[Command, ...]
    notify: tuple[Handler, ...] = ()
    starts_unit: str | None = None  # set when this change starts a stopped unit
    # handlers that must run first if already pending, e.g. daemon-reload before starting a new unit
    flush: tuple[Handler, ...] = ()


def relabel(changes: Iterable[Change], op: str) -> list[Change]:
    """Changes an operation planned through others (e.g. a unit through File), under its own name."""
    return [Change(op, c.diff, c.commands, c.notify, c.starts_unit, c.flush) for c in changes]


# `Skip.what` of the marker a role yields when the host needs a reboot to finish converging (e.g. a new
# kernel module); the runner reboots on it only with RunOptions.reboot, else it is reported.
REBOOT_REQUIRED = "reboot required"


@dataclass(frozen=True)
class Skip:
    """A step a role decided not to take on this host, with the reason (e.g. no GPU on the PCI bus)."""

    what: str
    reason: str


# What a fact's command printed and its exit code, as `Fact.parse` reads them.
RawOutput = tuple[str, int]


@dataclass(frozen=True)
class Combined:
    """One command answering several facts of a kind (one `stat` for many paths, one `systemctl
    show` for many units); `split` turns its (stdout, rc) into what each fact's own command gives."""

    command: str
    split: Callable[[str, int], dict[Fact[Any], RawOutput]]


class Fact(ABC, Generic[T_co]):
    """A command plus a parser. Subclasses are frozen dataclasses whose fields are the arguments,
    so a fact instance is its own cache key."""

    sudo: ClassVar[bool] = False

    @classmethod
    def combine(cls, facts: Sequence[Fact[Any]]) -> Combined | None:
        """One command for several facts of this class, or None: each runs its own command."""
        return None

    @abstractmethod
    def command(self) -> str:
        """The shell command whose output `parse` reads."""

    @abstractmethod
    def parse(self, stdout: str, rc: int) -> T_co:
        """The fact's value from the command's stdout and exit code."""


class FactSource(Protocol):
    """Where operations read facts: a host's cached gatherer, or FakeFacts in tests."""

    def get(self, fact: Fact[T]) -> T: ...


class FakeFacts:
    """Facts from a table, for operation tests (pyinfra's style): no SSH, no host."""

    def __init__(self, table: dict[Fact[Any], Any] | None = None) -> None:
        self._table: dict[Fact[Any], Any] = dict(table or {})

    def get(self, fact: Fact[T]) -> T:
        if fact not in self._table:
            raise KeyError(f"fake facts have no value for {fact!r}")
        return self._table[fact]


class Operation(ABC):
    """A desired state; `plan` returns the changes that reach it, [] when converged."""

    @abstractmethod
    def describe(self) -> str:
        """One line naming the operation, e.g. `file /etc/pdfleet/vllm-prefill.env`."""

    @abstractmethod
    def plan(self, facts: FactSource) -> list[Change]:
        """The changes needed given the host's facts."""

    def facts(self) -> Iterable[Fact[Any]]:
        """The facts `plan` reads on a converged host, so the runner gathers them in one round trip
        with every other operation's; facts not named here are gathered when `plan` asks."""
        return ()
