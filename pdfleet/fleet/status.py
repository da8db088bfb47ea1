"""A fleet's managed units as the hosts report them: systemd state and /health, both asked on the host."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pdfleet.errors import PdfleetError
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.roles import ManagedUnit, role_units
from pdfleet.model.inventory import Host
from pdfleet.ops.ssh import open_connection


@dataclass(frozen=True)
class UnitStatus:
    host: str
    unit: str
    active: str  # systemd ActiveState, or why it could not be read
    enabled: str
    health: str  # "ok", "-" without a health URL, else the failure

    @property
    def healthy(self) -> bool:
        return self.active == "active" and self.health in ("ok", "-")


def _health_script(units: list[ManagedUnit]) -> str:
    """One shell command printing `<unit> <HTTP code>` per unit with a health URL, run on the host
    itself, since a URL may be on the host's loopback (the router) and unreachable from here."""
    checks = [
        f"echo {shlex.quote(u.unit)} $(curl -s -o /dev/null --max-time 5 -w '%{{http_code}}' "
        f"{shlex.quote(u.health_url)})"
        for u in units
        if u.health_url
    ]
    return "; ".join(checks) or "true"


def _health(code: str | None, url: str | None) -> str:
    if url is None:
        return "-"
    if code == "200":
        return "ok"
    return "unreachable" if code in (None, "000") else f"HTTP {code}"


def _host_status(deployment: Deployment, host: Host, known_hosts: str, timeout: float) -> list[UnitStatus]:
    units: list[ManagedUnit] = role_units(deployment.roles, deployment.context(host))
    if not units:
        return []
    names = " ".join(shlex.quote(u.unit) for u in units)
    try:
        transport = open_connection(host, known_hosts, timeout)
    except PdfleetError as exc:
        return [UnitStatus(host.name, u.unit, f"unreachable: {exc}", "?", "?") for u in units]
    try:
        out = transport.run(f"systemctl show -p Id,ActiveState,UnitFileState {names}", timeout=timeout)
        health = transport.run(_health_script(units), timeout=timeout * len(units))
    finally:
        transport.close()
    codes = dict(line.split(" ", 1) for line in health.stdout.splitlines() if " " in line)
    props: dict[str, dict[str, str]] = {}
    for block in out.stdout.strip().split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in fields:
            props[fields["Id"]] = fields
    return [
        UnitStatus(
            host.name,
            u.unit,
            props.get(u.unit, {}).get("ActiveState", "unknown"),
            props.get(u.unit, {}).get("UnitFileState", "unknown"),
            _health(codes.get(u.unit), u.health_url),
        )
        for u in units
    ]


def fleet_status(
    deployment: Deployment, hosts: Sequence[Host], known_hosts: str, timeout: float = 10.0
) -> list[UnitStatus]:
    """Every managed unit of every host, hosts queried in parallel, in inventory order."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        results = pool.map(lambda h: _host_status(deployment, h, known_hosts, timeout), hosts)
    return [row for rows in results for row in rows]
