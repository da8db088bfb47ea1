"""A fleet's managed units as the hosts report them: state over SSH, health over HTTP."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pdfleet.errors import PdfleetError
from pdfleet.inventory import Host
from pdfleet.ops.ssh import open_connection
from pdfleet.provision import Deployment
from pdfleet.roles_api import ManagedUnit, role_units


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


def _health(url: str | None, timeout: float) -> str:
    if url is None:
        return "-"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - inventory addresses only
            return "ok" if resp.status == 200 else f"HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"unreachable ({getattr(exc, 'reason', exc)})"


def _host_status(deployment: Deployment, host: Host, known_hosts: str, timeout: float) -> list[UnitStatus]:
    units: list[ManagedUnit] = role_units(deployment.roles, deployment.context(host))
    if not units:
        return []
    names = " ".join(u.unit for u in units)
    try:
        transport = open_connection(host, known_hosts, timeout)
    except PdfleetError as exc:
        return [UnitStatus(host.name, u.unit, f"unreachable: {exc}", "?", "?") for u in units]
    try:
        out = transport.run(f"systemctl show -p Id,ActiveState,UnitFileState {names}", timeout=timeout)
    finally:
        transport.close()
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
            _health(u.health_url, timeout),
        )
        for u in units
    ]


def fleet_status(deployment: Deployment, hosts: Sequence[Host], known_hosts: str,
                 timeout: float = 10.0) -> list[UnitStatus]:
    """Every managed unit of every host, hosts queried in parallel, in inventory order."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        results = pool.map(lambda h: _host_status(deployment, h, known_hosts, timeout), hosts)
    return [row for rows in results for row in rows]
