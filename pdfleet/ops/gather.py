"""The per-host fact gatherer: each distinct fact's command runs once per run, its value is cached.

`gather` fetches many facts in one remote command (pdfleet.ops.batch), so a host's facts cost one
round trip and one sudo session instead of one each; `get` fetches a fact nobody gathered on its own.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from pdfleet.ops.base import Change, Fact, FactSource, Operation, Skip, Upload
from pdfleet.ops.batch import batch_script, split_batch
from pdfleet.ops.errors import FactError
from pdfleet.ops.files import DirectoryState, FileContent, FileState, PathInfo

T = TypeVar("T")
H = TypeVar("H")


class CommandRunner(Protocol):
    """What HostFacts needs from a transport."""

    def run(self, cmd: str, sudo: bool = False, timeout: float | None = None) -> Any:
        """Run a command; the result has `rc`, `stdout`, `stderr`."""
        ...


def _stderr_tail(stderr: str, lines: int = 3) -> list[str]:
    """The last lines of a command's stderr, for an error message."""
    return stderr.strip().splitlines()[-lines:] if stderr else []


class HostFacts:
    """A host's facts, gathered in batches or lazily: one command per batch or per lone fact, cached."""

    def __init__(self, conn: CommandRunner, timeout: float | None = 120) -> None:
        self._conn = conn
        self._timeout = timeout
        self._cache: dict[Fact[Any], Any] = {}
        self._errors: dict[Fact[Any], FactError] = {}
        self._lock = threading.Lock()
        self.commands = 0  # remote commands run so far (round trips)

    def get(self, fact: Fact[T]) -> T:
        """The fact's value, running its command on first use (a batch's parse error is raised here)."""
        with self._lock:
            if fact in self._errors:
                raise self._errors[fact]
            if fact in self._cache:
                return self._cache[fact]
            out = self._run(fact.command(), fact.sudo)
            self._store(fact, out.stdout, out.rc, out.stderr)
            if fact in self._errors:
                raise self._errors[fact]
            return self._cache[fact]

    def gather(self, facts: Iterable[Fact[Any]]) -> None:
        """Fetch every fact not known yet in one remote command: as root when any of them needs root
        (facts only read), each in its own subshell. A fact the batch could not answer is left for `get`."""
        with self._lock:
            missing = [f for f in dict.fromkeys(facts) if f not in self._cache and f not in self._errors]
            if not missing:
                return
            token = secrets.token_hex(8)
            script, units = batch_script(missing, token)
            sudo = any(f.sudo for f in missing)
            out = self._run(script, sudo)
            result = split_batch(units, token, out.stdout, out.stderr)
            if not result.outputs and out.rc != 0:
                how = " as root (sudo -n)" if sudo else ""
                detail = " ".join(_stderr_tail(out.stderr))
                raise FactError(
                    f"gathering {len(missing)} facts{how} failed before any ran (exit {out.rc}): {detail}"
                )
            for fact, (stdout, rc) in result.outputs.items():
                self._store(fact, stdout, rc, result.stderr.get(fact, ""))

    def _run(self, cmd: str, sudo: bool) -> Any:
        """One remote command, counted."""
        self.commands += 1
        return self._conn.run(cmd, sudo=sudo, timeout=self._timeout)

    def _store(self, fact: Fact[Any], stdout: str, rc: int, stderr: str) -> None:
        """Parse and cache a fact's value, or keep its FactError (with the command's stderr) for `get`."""
        try:
            self._cache[fact] = fact.parse(stdout, rc)
        except FactError as exc:
            self._errors[fact] = FactError(" ".join([str(exc), *_stderr_tail(stderr)]))

    def known(self, fact: Fact[Any]) -> bool:
        """Whether the fact was gathered (its value or its error is cached)."""
        with self._lock:
            return fact in self._cache or fact in self._errors

    @property
    def gathered(self) -> int:
        """How many distinct facts were gathered."""
        return len(self._cache)


class _Unknown(Exception):
    """A trial plan asked for a fact not gathered yet."""

    def __init__(self, fact: Fact[Any]) -> None:
        super().__init__(repr(fact))
        self.fact = fact


class _Probe:
    """Facts already gathered, for trial plans that find which facts the real plans will ask for."""

    def __init__(self, facts: HostFacts) -> None:
        self._facts = facts

    def get(self, fact: Fact[T]) -> T:
        if not self._facts.known(fact):
            raise _Unknown(fact)
        return self._facts.get(fact)


DISCOVERY_ROUNDS = 4


def gather_for(
    facts: HostFacts,
    planner: Callable[[H, FactSource], Iterable[Operation | Skip]],
    host: H,
    prefetch: Callable[[H], Iterable[Fact[Any]]] | None,
) -> None:
    """Gather in as few round trips as possible what planning this host will read: the prefetch facts,
    then every fact its operations name, then (trial plans) the ones they ask for beyond those.

    A planner or plan that fails here is left alone: the real planning pass reports it in context.
    """
    facts.gather(prefetch(host) if prefetch else ())
    try:
        ops = [item for item in planner(host, facts) if isinstance(item, Operation)]
    except Exception:  # reported by the planning pass, which runs the planner again
        return
    facts.gather(fact for op in ops for fact in op.facts())
    probe = _Probe(facts)
    for _ in range(DISCOVERY_ROUNDS):
        wanted: list[Fact[Any]] = []
        for op in ops:
            try:
                op.plan(probe)
            except _Unknown as unknown:
                wanted.append(unknown.fact)
            except Exception:  # reported by the planning pass
                continue
        if not wanted:
            return
        facts.gather(wanted)


class PlannedFacts:
    """Facts as they will be once the changes planned so far are applied (for uploaded files).

    Plans are made before anything is applied; this overlay lets an op that reads a file an
    earlier op in the same run writes (the same path written twice) plan against that content.
    """

    def __init__(self, base: FactSource) -> None:
        self._base = base
        self._overrides: dict[Fact[Any], Any] = {}

    def get(self, fact: Fact[T]) -> T:
        """The planned value when an earlier change decided it, else the host's fact."""
        if fact in self._overrides:
            return self._overrides[fact]
        return self._base.get(fact)

    def record(self, changes: Iterable[Change]) -> None:
        """Remember the state the changes' uploads leave behind."""
        for change in changes:
            for cmd in change.commands:
                if isinstance(cmd, Upload):
                    digest = hashlib.sha256(cmd.content).hexdigest()
                    info = PathInfo("file", cmd.mode, cmd.owner, cmd.group, len(cmd.content), digest)
                    self._overrides[FileState(cmd.dest)] = info
                    self._overrides[DirectoryState(cmd.dest)] = replace(info, sha256=None)
                    try:
                        text: str | None = cmd.content.decode("utf-8")
                    except UnicodeDecodeError:
                        text = None
                    self._overrides[FileContent(cmd.dest)] = text
