"""The per-host fact gatherer: each distinct fact's command runs once per run, its value is cached."""

from __future__ import annotations

import threading
from typing import Any, Protocol, TypeVar

from pdfleet.ops.base import Fact
from pdfleet.ops.errors import FactError

T = TypeVar("T")


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
