"""systemd: the SystemdUnit and Service operations, their handlers and health waits, and the quoting of
values into unit and EnvironmentFile= syntax. Unit state is read by the one unit-health fact
(pdfleet.ops.unit_health), whose health probe the waits run too.

A changed unit file queues one daemon-reload and a restart of that unit only; a start or restart
clears a failed state first and, given a health URL, is done only once the URL answers.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pdfleet.ops.base import (
    DAEMON_RELOAD,
    Change,
    Command,
    Fact,
    FactSource,
    Handler,
    Operation,
    Run,
    relabel,
)
from pdfleet.ops.errors import OperationError
from pdfleet.ops.files import File, FileState
from pdfleet.ops.unit_health import HEALTH_OK, UnitHealth, http_code_cmd

q = shlex.quote

_SYSTEMD_BARE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def journal_cmd(unit: str, lines: int = 30) -> str:
    """The diagnostic whose output joins a failed start/restart: the unit's last journal lines."""
    return f"journalctl -u {q(unit)} -n {lines} --no-pager"


def health_wait(unit: str, url: str, timeout: float) -> Run:
    """Wait on the host until `url` answers 200 (the unit-health fact's probe), failing early if the unit
    fails."""
    secs = max(1, int(timeout))
    # unit and url come from the profile/inventory: every use is quoted, the messages too. Polled every
    # 0.5 s: a simulator answers ~2 s after its start, so a 2 s poll added ~1 s to each wait of a converge.
    failed = q(f"{unit} failed while starting")
    late = q(f"{unit}: {url} did not answer within {secs}s")
    cmd = (
        f"deadline=$(( $(date +%s) + {secs} )); "
        f'until [ "$({http_code_cmd(url)})" = {HEALTH_OK} ]; do '
        f"if systemctl is-failed --quiet {q(unit)}; then "
        f"echo {failed} >&2; exit 1; fi; "
        f"if [ $(date +%s) -ge $deadline ]; then "
        f"echo {late} >&2; exit 1; fi; "
        "sleep 0.5; done"
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
        return (UnitHealth(self.unit),)

    def plan(self, facts: FactSource) -> list[Change]:
        state = facts.get(UnitHealth(self.unit))
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


# The first line of every unit file pdfleet renders (templates/*.service.j2): what marks a unit as its own.
MANAGED_MARKER = "# Managed by pdfleet;"


@dataclass(frozen=True)
class ManagedUnitFiles(Fact[frozenset[str]]):
    """The unit files in `directory` matching `glob` whose first line is pdfleet's marker: the units
    pdfleet installed there (a unit an operator wrote under the same name pattern is not one of them)."""

    glob: str
    directory: str = "/etc/systemd/system"

    def command(self) -> str:
        # the glob stays unquoted so the shell expands it; a glob matching nothing leaves it literal,
        # which [ -f ] skips
        return (
            f"for f in {q(self.directory)}/{self.glob}; do "
            f'[ -f "$f" ] && head -n 1 "$f" | grep -qF {q(MANAGED_MARKER)} && echo "${{f##*/}}"; '
            "done; true"
        )

    def parse(self, stdout: str, rc: int) -> frozenset[str]:
        return frozenset(line.strip() for line in stdout.splitlines() if line.strip())


@dataclass(frozen=True)
class RetireUnits(Operation):
    """pdfleet's own units matching `glob` that the host no longer runs (not in `keep`): stopped,
    disabled, their unit file and env file (`env_dir`/<stem>.env) removed, then one daemon-reload.
    Without this a renamed or dropped instance keeps running on its port beside its successor."""

    glob: str
    keep: frozenset[str]
    env_dir: str | None = None
    directory: str = "/etc/systemd/system"

    def describe(self) -> str:
        return f"retired units {self.directory}/{self.glob}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (ManagedUnitFiles(self.glob, self.directory),)

    def plan(self, facts: FactSource) -> list[Change]:
        stale = sorted(facts.get(ManagedUnitFiles(self.glob, self.directory)) - self.keep)
        return [self._remove(unit) for unit in stale]

    def _remove(self, unit: str) -> Change:
        paths = [f"{self.directory}/{unit}"]
        if self.env_dir:
            paths.append(f"{self.env_dir}/{unit.removesuffix('.service')}.env")
        commands: tuple[Command, ...] = (
            Run(f"systemctl disable --now {q(unit)}", on_fail=journal_cmd(unit)),
            Run(f"systemctl reset-failed {q(unit)} 2>/dev/null; rm -f {' '.join(q(p) for p in paths)}"),
        )
        diff = f"stop, disable and remove {unit} and {', '.join(paths[1:]) or 'its unit file'} (not run here)"
        return Change(self.describe(), diff, commands, notify=(DAEMON_RELOAD,))


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
