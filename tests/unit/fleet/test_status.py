"""Fleet status: rows from the unit-health fact of a real systemd (one command per host), and a host that
does not answer over SSH named on each of its rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port
from pdfleet.fleet.roles import ManagedUnit
from pdfleet.fleet.status import UnitStatus, fleet_status, statuses
from pdfleet.lab.sshkeys import ensure_client_key
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.ssh import LocalTransport
from tests.unit.fleet.helpers import REPO, fleet_of
from tests.unit.helpers import SystemdUnits, UserSystemd


@pytest.mark.systemd
def test_rows_come_from_one_command_per_host(
    systemd: UserSystemd, systemd_units: SystemdUnits, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in systemd.env.items():
        monkeypatch.setenv(name, value)
    units = [
        ManagedUnit(
            "down.service", systemd_units.closed_port, f"http://127.0.0.1:{systemd_units.closed_port}/"
        ),
        ManagedUnit("web.service", systemd_units.port, systemd_units.health_url),
        ManagedUnit("nope.service", None, None),
    ]
    facts = HostFacts(LocalTransport())
    rows = statuses("here", units, facts)
    assert facts.commands == 1
    assert rows == [
        UnitStatus("here", "down.service", "failed", "static", "unreachable", False),
        UnitStatus("here", "web.service", "active", "indirect", "ok", True),
        UnitStatus("here", "nope.service", "inactive", "not-found", "-", False),
    ]


def test_a_host_that_does_not_answer_is_named_on_each_row(tmp_path: Path) -> None:
    fleet = fleet_of("lab-cross", REPO / "inventory/lab.yml")
    key = tmp_path / "id_ed25519"  # a key of its own: the lab's may not exist yet (lab.build runs beside)
    ensure_client_key(key)
    lab_d1 = fleet.inventory.hosts["lab-d1"]
    host = dataclasses.replace(lab_d1, address="127.0.0.1", port=free_port(), key_file=str(key))
    rows = fleet_status(fleet, [host], str(tmp_path) + "/known_hosts", timeout=2)
    assert [r.unit for r in rows] == ["vllm-decode.service", "prometheus-node-exporter.service"]
    for row in rows:
        assert row.active.startswith("unreachable: cannot connect to lab-d1 (127.0.0.1:")
        assert not row.healthy and row.health == "?"
