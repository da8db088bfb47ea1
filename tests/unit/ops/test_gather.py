"""The per-host fact cache on this machine: one command per distinct fact, errors carry the stderr, and
`gather_for` batches what planning will read into few round trips."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pdfleet.ops.apt import CommandRc
from pdfleet.ops.base import Change, Fact, FactSource, Operation, Skip
from pdfleet.ops.errors import FactError
from pdfleet.ops.gather import HostFacts, gather_for
from pdfleet.ops.ssh import LocalTransport

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_host_facts_caches_one_command_per_fact(tmp_path) -> None:
    counter = tmp_path / "count"
    transport = LocalTransport()
    facts = HostFacts(transport)
    fact = CommandRc(f"echo x >> {counter}; exit 3")
    assert facts.get(fact) == 3
    assert facts.get(CommandRc(f"echo x >> {counter}; exit 3")) == 3  # equal args → same cache key
    assert counter.read_text() == "x\n"
    assert facts.gathered == 1


@dataclass(frozen=True)
class Unreadable(Fact[str]):
    """A fact whose tool fails: the parser cannot make sense of the output."""

    def command(self) -> str:
        return "echo starting >&2; echo 'tool: no such device' >&2; exit 2"

    def parse(self, stdout: str, rc: int) -> str:
        raise FactError(f"tool failed (exit {rc})")


def test_a_fact_error_carries_the_commands_last_stderr_lines() -> None:
    with pytest.raises(FactError) as err:
        HostFacts(LocalTransport()).get(Unreadable())
    assert str(err.value) == "tool failed (exit 2) starting tool: no such device"


@dataclass(frozen=True)
class _Counting(Fact[int]):
    """A fact that records each time its command runs on the host."""

    log: str
    name: str

    def command(self) -> str:
        return f"echo {self.name} >> {self.log}"

    def parse(self, stdout: str, rc: int) -> int:
        return rc


@dataclass(frozen=True)
class _Undeclared(Operation):
    """An operation that names no facts but reads two, the second only after the first."""

    log: str

    def describe(self) -> str:
        return "undeclared"

    def plan(self, facts: FactSource) -> list[Change]:
        facts.get(_Counting(self.log, "first"))
        facts.get(_Counting(self.log, "second"))
        return []


@dataclass(frozen=True)
class _Declared(_Undeclared):
    def facts(self) -> tuple[Fact[int], ...]:
        return (_Counting(self.log, "first"), _Counting(self.log, "second"))


def test_gather_for_batches_declared_and_discovered_facts(tmp_path) -> None:
    log = str(tmp_path / "log")
    prefetch = _Counting(log, "host")

    def planner(host: str, facts: FactSource) -> list[Operation | Skip]:
        facts.get(prefetch)  # read before any operation: answered by the prefetch batch
        return [_Declared(log), _Undeclared(log + "2")]

    facts = HostFacts(LocalTransport())
    gather_for(facts, planner, "h1", lambda host: [prefetch])
    # prefetch; the declared facts; then trial plans find the undeclared op's facts one level at a time
    assert facts.commands == 4
    for op in planner("h1", facts):
        assert isinstance(op, Operation) and op.plan(facts) == []
    assert facts.commands == 4  # planning ran nothing more
    assert (tmp_path / "log").read_text().split() == ["host", "first", "second"]
    assert (tmp_path / "log2").read_text().split() == ["first", "second"]
