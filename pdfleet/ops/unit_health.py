"""The unit-health fact: a unit's systemd state and, given its health URL, what that URL answers, both
asked on the host (a URL may be on the host's loopback, out of reach from the control machine).

Every reader of unit state uses it: the Service operation, provision's health waits (the same probe),
`invoke demo`'s status table (`fleet.status`), verify's service checks and doctor. Many units of a host
are asked in one remote command: one `systemctl show` for all of them and every URL probed at once.

What systemd does (systemd 252, checked against a running instance): `systemctl show -p P… -- U1 U2`
prints one block per argument, in argument order, blocks separated by a blank line, and each block's
properties in systemd's own order whatever the order of the `-p` options. A block names the unit by its
canonical `Id`, which is not the argument for an alias (`Id=zeta.service` for `aliasz.service`, with
`Names=zeta.service aliasz.service`) nor for a name without a suffix; a glob argument prints a block per
loaded unit it matches, or none. So each unit is found by its name in a block's `Id` or `Names`, never by
the block's position.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.ops.base import Combined, Fact, RawOutput
from pdfleet.ops.errors import FactError

q = shlex.quote

PROPERTIES = ("Id", "Names", "LoadState", "ActiveState", "SubState", "UnitFileState")
HEALTH_LINE = "@pdfleet-health"  # `@pdfleet-health <HTTP code> <url>`: no systemctl property looks so
HEALTH_OK = "200"
PROBE_TIMEOUT_S = 5
NO_URL = "-"
# The CA an https probe verifies against: the gateway's (the profile's gateway.tls.ca_file), which
# provision puts on every host that calls a TLS gateway (pdfleet.fleet.host_layout names it too)
GATEWAY_CA_FILE = "/etc/pdfleet/tls/gateway-ca.crt"


@dataclass(frozen=True)
class UnitState:
    """A unit's state as systemd reports it, and its health: "ok", "-" (no URL asked), else why not."""

    load_state: str  # loaded / not-found / masked ...
    active_state: str  # active / inactive / failed / activating ...
    sub_state: str
    unit_file_state: str  # enabled / disabled / static / masked / "" ...
    health: str = NO_URL

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

    @property
    def healthy(self) -> bool:
        """Active, and its health URL (when it has one) answers 200."""
        return self.active_state == "active" and self.health in ("ok", NO_URL)


def http_code_cmd(url: str) -> str:
    """A shell command printing the HTTP status `url` answers on the host (000: no answer): the one probe
    of a unit's health, in the fact and in provision's waits alike. An https URL is a TLS gateway's,
    verified against the gateway's CA provision puts on the host (no -k: a wrong certificate is 000)."""
    trust = f"--cacert {q(GATEWAY_CA_FILE)} " if url.startswith("https://") else ""
    return (
        f"curl -s -o /dev/null --max-time {PROBE_TIMEOUT_S} {trust}-w '%{{http_code}}' {q(url)} "
        "2>/dev/null || true"
    )


def health_of(code: str | None) -> str:
    """What a probe's HTTP code says: "ok" for 200, else why the unit is not healthy."""
    if code == HEALTH_OK:
        return "ok"
    if code is None:
        return "not probed"
    return "unreachable" if code in ("", "000") else f"HTTP {code}"


def unit_health_cmd(units: Sequence[str], urls: Sequence[str]) -> str:
    """One command for many units: `systemctl show` of them all, then every URL probed in parallel (one
    short line each, written at once); it exits with systemctl's code."""
    show = f"systemctl show {' '.join(f'-p {p}' for p in PROPERTIES)} -- {' '.join(q(u) for u in units)}"
    probes = [f"printf '%s %s %s\\n' {HEALTH_LINE} \"$({http_code_cmd(url)})\" {q(url)} &" for url in urls]
    return "\n".join([f"{show}; rc=$?", *probes, "wait", "exit $rc"]) if probes else show


def _blocks(stdout: str) -> list[dict[str, str]]:
    """The property blocks of `systemctl show` output (health lines left out)."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in stdout.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, sep, value = line.partition("=")
        if sep and not line.startswith(HEALTH_LINE):
            current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def _names(block: dict[str, str]) -> set[str]:
    """Every name a block's unit answers to: its Id and its aliases."""
    return {block.get("Id", ""), *block.get("Names", "").split()} - {""}


def _health_codes(stdout: str) -> dict[str, str]:
    """url -> HTTP code from the probe lines."""
    codes = {}
    for line in stdout.splitlines():
        if line.startswith(HEALTH_LINE + " "):
            parts = line.split(" ", 2)
            if len(parts) == 3:
                codes[parts[2]] = parts[1]
    return codes


def parse_unit_health(stdout: str, unit: str, url: str | None) -> UnitState:
    """The state of `unit` (found by Id or alias) and the health of `url` in a unit-health output."""
    wanted = {unit, unit if "." in unit else f"{unit}.service"}
    block = next((b for b in _blocks(stdout) if wanted & _names(b)), None)
    if block is None or "LoadState" not in block or "ActiveState" not in block:
        raise FactError(f"systemctl show printed no state for {unit}: {stdout.strip()[:200]!r}")
    return UnitState(
        load_state=block["LoadState"],
        active_state=block["ActiveState"],
        sub_state=block.get("SubState", ""),
        unit_file_state=block.get("UnitFileState", ""),
        health=health_of(_health_codes(stdout).get(url)) if url else NO_URL,
    )


@dataclass(frozen=True)
class UnitHealth(Fact[UnitState]):
    """A unit's systemd state and, given `health_url`, what that URL answers on the host."""

    unit: str
    health_url: str | None = None

    def command(self) -> str:
        return unit_health_cmd([self.unit], [self.health_url] if self.health_url else [])

    def parse(self, stdout: str, rc: int) -> UnitState:
        if rc != 0:
            raise FactError(f"systemctl show {self.unit} failed (exit {rc}); is systemd running?")
        return parse_unit_health(stdout, self.unit, self.health_url)

    @classmethod
    def combine(cls, facts: Sequence[Fact[Any]]) -> Combined | None:
        """One command for every unit and URL; each fact finds its own unit and URL in the whole output."""
        group = [f for f in facts if isinstance(f, UnitHealth)]
        if len(group) != len(facts):
            return None
        units = list(dict.fromkeys(f.unit for f in group))
        urls = list(dict.fromkeys(f.health_url for f in group if f.health_url))

        def split(stdout: str, rc: int) -> dict[Fact[Any], RawOutput]:
            return {f: (stdout, rc) for f in group}

        return Combined(unit_health_cmd(units, urls), split)
