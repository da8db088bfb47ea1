"""A fleet's managed units as the hosts report them: each host's units and /health URLs read by the one
unit-health fact (pdfleet.ops.unit_health), all of a host's units in one remote command."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from pdfleet.errors import PdfleetError
from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.roles import ManagedUnit, role_units
from pdfleet.model.inventory import Host
from pdfleet.ops.errors import FactError
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import open_connection
from pdfleet.ops.unit_health import PROBE_TIMEOUT_S, UnitHealth, UnitState


@dataclass(frozen=True)
class UnitStatus:
    """One managed unit of a host: its systemd state and health, or why they could not be read."""

    host: str
    unit: str
    active: str  # systemd ActiveState, or why it could not be read
    enabled: str
    health: str  # "ok", "-" without a health URL, else the failure
    healthy: bool


def unit_facts(units: Sequence[ManagedUnit]) -> list[UnitHealth]:
    """The unit-health fact of each managed unit, with its health URL."""
    return [UnitHealth(u.unit, u.health_url) for u in units]


def statuses(host: str, units: Sequence[ManagedUnit], facts: HostFacts) -> list[UnitStatus]:
    """Each unit's row from a host's facts (gathered in one command), or the reason it could not be read."""
    facts.gather(unit_facts(units))
    rows = []
    for fact in unit_facts(units):
        try:
            state: UnitState = facts.get(fact)
        except (FactError, PdfleetError) as exc:
            rows.append(UnitStatus(host, fact.unit, f"unknown: {exc}", "?", "?", False))
            continue
        enabled = state.unit_file_state or state.load_state
        rows.append(UnitStatus(host, fact.unit, state.active_state, enabled, state.health, state.healthy))
    return rows


def _host_status(deployment: Deployment, host: Host, known_hosts: str, timeout: float) -> list[UnitStatus]:
    """One host's rows: connect, one command for every unit, close; a host that does not answer gives
    its reason on every row."""
    units = role_units(deployment.roles, deployment.context(host))
    if not units:
        return []
    try:
        transport = open_connection(host, known_hosts, timeout)
    except PdfleetError as exc:
        return [UnitStatus(host.name, u.unit, f"unreachable: {exc}", "?", "?", False) for u in units]
    try:
        # the probes run in parallel, each bounded: the batch needs little more than one probe's time
        return statuses(host.name, units, HostFacts(transport, timeout=timeout + PROBE_TIMEOUT_S))
    except (FactError, PdfleetError) as exc:
        return [UnitStatus(host.name, u.unit, f"unknown: {exc}", "?", "?", False) for u in units]
    finally:
        transport.close()


def fleet_status(
    deployment: Deployment, hosts: Sequence[Host], known_hosts: str, timeout: float = 10.0
) -> list[UnitStatus]:
    """Every managed unit of every host, hosts queried in parallel, in inventory order."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        results = pool.map(lambda h: _host_status(deployment, h, known_hosts, timeout), hosts)
    return [row for rows in results for row in rows]
