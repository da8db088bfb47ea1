"""The per-host fact cache on this machine: one command per distinct fact, errors carry the stderr."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pdfleet.ops.apt import CommandRc
from pdfleet.ops.base import Fact
from pdfleet.ops.errors import FactError
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import LocalTransport


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
