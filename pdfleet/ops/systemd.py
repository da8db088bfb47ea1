"""systemd: the unit-state fact, the SystemdUnit and Service operations, their handlers and health waits,
and the quoting of values into unit and EnvironmentFile= syntax.

A changed unit file queues one daemon-reload and a restart of that unit only; a start or restart
clears a failed state first and, given a health URL, is done only once the URL answers.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.ops.base import (
    DAEMON_RELOAD,
    Change,
    Combined,
    Command,
    Fact,
    FactSource,
    Handler,
    Operation,
    RawOutput,
    Run,
    relabel,
)
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.files import File, FileState

q = shlex.quote

_SYSTEMD_BARE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


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

    @classmethod
    def combine(cls, facts: Sequence[Fact[Any]]) -> Combined | None:
        """One `systemctl show` for every unit (it prints one block per unit, in order, separated by a
        blank line)."""
        units = [f.unit for f in facts if isinstance(f, SystemdUnitState)]
        if len(units) != len(facts):
            return None
        command = (
            "systemctl show -p Id -p LoadState -p ActiveState -p SubState -p UnitFileState -- "
            + " ".join(shlex.quote(u) for u in units)
        )

        def split(stdout: str, rc: int) -> dict[Fact[Any], RawOutput]:
            blocks = [b for b in stdout.strip("\n").split("\n\n")] if stdout.strip() else []
            if rc != 0 or len(blocks) != len(facts):
                return {f: (stdout, rc or 1) for f in facts}  # each fact reports the failure itself
            return {f: (block + "\n", 0) for f, block in zip(facts, blocks, strict=True)}

        return Combined(command, split)


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


@dataclass(frozen=True)
class SystemdUnit(Operation):
    """A unit file; a change queues one daemon-reload and the given restart handler."""

    name: str
    content: str | bytes = field(repr=False)
    restart: Handler | None = None
    directory: str = "/etc/systemd/system"

    def describe(self) -> str:
        return f"systemd unit {self.name}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (FileState(f"{self.directory}/{self.name}"),)

    def plan(self, facts: FactSource) -> list[Change]:
        notify = (DAEMON_RELOAD,) + ((self.restart,) if self.restart else ())
        target = File(f"{self.directory}/{self.name}", self.content, "0644", notify=notify)
        return relabel(target.plan(facts), self.describe())


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

    def facts(self) -> Iterable[Fact[Any]]:
        return (SystemdUnitState(self.unit),)

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


def systemd_arg(arg: str) -> str:
    """Quote one argv word for ExecStart= so systemd passes it intact (JSON included).

    systemd expands `%` specifiers and `$VAR` in ExecStart and unescapes C-style backslashes inside
    quotes; doubling `%`/`$` and escaping `\\` and `"` keeps the word literal.
    """
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and _SYSTEMD_BARE.match(escaped):
        return escaped
    if "'" not in escaped and "\\" not in escaped:
        return f"'{escaped}'"  # the readable form for JSON: nothing inside needs escaping
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_command(argv: Iterable[str]) -> str:
    """A whole ExecStart= command line from an argv list."""
    return " ".join(systemd_arg(a) for a in argv)


def env_value(value: Any) -> str:
    """A value for a systemd EnvironmentFile= line (double-quoted when it has spaces or quotes)."""
    text = str(value)
    if re.match(r"^[A-Za-z0-9_@%+=:,./-]*$", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
