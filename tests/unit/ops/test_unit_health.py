"""The unit-health fact: units found by Id or alias whatever the order of systemctl's blocks, health from the
probe lines; one command for a host's units; and the same against a real systemd with real units."""

from __future__ import annotations

import os
import subprocess

import pytest

from pdfleet.ops.base import FakeFacts
from pdfleet.ops.errors import FactError
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.runner import CommandError, execute
from pdfleet.ops.ssh import LocalTransport
from pdfleet.ops.systemd import Service, health_wait
from pdfleet.ops.unit_health import (
    HEALTH_LINE,
    UnitHealth,
    UnitState,
    health_of,
    parse_unit_health,
    unit_health_cmd,
)
from tests.unit.helpers import SystemdUnits, UserSystemd

# What systemd 252 printed for `show -p Id -p Names -p LoadState ... -- zeta.service nope.service
# aliasz.service` (aliasz.service a symlink to zeta.service), then two probe lines.
SHOWN = """Id=zeta.service
Names=zeta.service aliasz.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=indirect

Id=nope.service
Names=nope.service
LoadState=not-found
ActiveState=inactive
SubState=dead
UnitFileState=

Id=alpha.service
Names=alpha.service
LoadState=loaded
ActiveState=failed
SubState=failed
UnitFileState=static
@pdfleet-health 200 http://127.0.0.1:8100/health
@pdfleet-health 000 http://127.0.0.1:8200/health
"""


def test_units_are_found_by_id_or_alias_not_by_position() -> None:
    zeta = parse_unit_health(SHOWN, "zeta.service", "http://127.0.0.1:8100/health")
    assert zeta == UnitState("loaded", "active", "running", "indirect", "ok") and zeta.healthy
    alias = parse_unit_health(SHOWN, "aliasz.service", None)  # its block says Id=zeta.service
    assert alias.running and alias.health == "-" and alias.healthy
    assert parse_unit_health(SHOWN, "zeta", None).running  # systemd adds .service, so do we
    alpha = parse_unit_health(SHOWN, "alpha.service", "http://127.0.0.1:8200/health")
    assert (alpha.active_state, alpha.enabled, alpha.health, alpha.healthy) == (
        "failed",
        True,
        "unreachable",
        False,
    )
    nope = parse_unit_health(SHOWN, "nope.service", None)
    assert not nope.exists and not nope.running and not nope.enabled
    with pytest.raises(FactError, match="no state for other.service"):
        parse_unit_health(SHOWN, "other.service", None)


def test_health_says_why_not() -> None:
    assert [health_of(c) for c in ("200", "000", "", "503", None)] == [
        "ok",
        "unreachable",
        "unreachable",
        "HTTP 503",
        "not probed",
    ]
    active = UnitState("loaded", "active", "running", "enabled", "HTTP 503")
    assert not active.healthy


def test_systemctl_failing_is_a_fact_error() -> None:
    with pytest.raises(FactError, match="systemctl show x.service failed .exit 1.; is systemd running"):
        UnitHealth("x.service").parse("System has not been booted with systemd", 1)


def test_one_command_for_every_unit_and_url_each_fact_reading_its_own() -> None:
    facts = [
        UnitHealth("alpha.service", "http://127.0.0.1:8200/health"),
        UnitHealth("zeta.service", "http://127.0.0.1:8100/health"),
        UnitHealth("zeta.service"),
    ]
    combined = UnitHealth.combine(facts)
    assert combined is not None
    assert combined.command.count("systemctl show") == 1
    assert combined.command.splitlines()[0].endswith("-- alpha.service zeta.service; rc=$?")
    assert combined.command.count("127.0.0.1:8100/health") == 2  # once probed, once printed
    split = combined.split(SHOWN, 0)
    assert [f.parse(*split[f]).health for f in facts] == ["unreachable", "ok", "-"]
    assert unit_health_cmd(["a.service"], []) == (
        "systemctl show -p Id -p Names -p LoadState -p ActiveState -p SubState -p UnitFileState -- a.service"
    )


def test_service_reads_the_fact_without_a_health_url() -> None:
    op = Service("x.service", health_url="http://127.0.0.1:1/health")
    assert list(op.facts()) == [UnitHealth("x.service")]
    running = UnitState("loaded", "active", "running", "enabled")
    assert op.plan(FakeFacts({UnitHealth("x.service"): running})) == []


@pytest.mark.systemd
def test_a_real_systemd_answers_every_unit_in_one_command(
    systemd: UserSystemd, systemd_units: SystemdUnits, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, closed = systemd_units.port, systemd_units.closed_port
    for name, value in systemd.env.items():
        monkeypatch.setenv(name, value)
    web = f"http://127.0.0.1:{port}/health"
    asked = [
        UnitHealth("down.service", f"http://127.0.0.1:{closed}/health"),
        UnitHealth("nope.service"),
        UnitHealth("www.service"),  # an alias: its block's Id is web.service
        UnitHealth("web.service", web),
        UnitHealth("web.service", f"http://127.0.0.1:{port}/missing"),
    ]
    facts = HostFacts(LocalTransport())
    facts.gather(asked)
    assert facts.commands == 1
    got = [facts.get(f) for f in asked]
    assert facts.commands == 1  # every value came from the one command
    assert (got[0].active_state, got[0].health) == ("failed", "unreachable")
    assert not got[1].exists
    assert got[2].running and got[2].health == "-"
    assert got[3].healthy and got[3].health == "ok" and got[3].sub_state == "running"
    assert got[4].health == "HTTP 404" and not got[4].healthy
    # the probe lines are ours, not systemd's
    assert (
        HEALTH_LINE
        not in subprocess.run(
            ["systemctl", "show", "web.service"],
            env={**os.environ, **systemd.env},
            capture_output=True,
            text=True,
        ).stdout
    )


@pytest.mark.systemd
def test_provision_waits_with_the_same_probe_on_a_real_unit(
    systemd: UserSystemd, systemd_units: SystemdUnits, monkeypatch: pytest.MonkeyPatch
) -> None:
    port, closed = systemd_units.port, systemd_units.closed_port
    for name, value in systemd.env.items():
        monkeypatch.setenv(name, value)
    execute(LocalTransport(), health_wait("web.service", f"http://127.0.0.1:{port}/health", 10), timeout=30)
    failed = health_wait("down.service", f"http://127.0.0.1:{closed}/health", 30)
    with pytest.raises(CommandError, match="down.service failed while starting"):
        execute(LocalTransport(), failed, timeout=30)  # early: the unit failed, no 30 s wait


def test_an_https_probe_verifies_against_the_gateways_ca() -> None:
    from pdfleet.ops.unit_health import GATEWAY_CA_FILE, http_code_cmd

    assert f"--cacert {GATEWAY_CA_FILE} " in http_code_cmd("https://10.0.0.1:8080/health")
    assert "--cacert" not in http_code_cmd("http://10.0.0.1:8080/health")
    assert " -k " not in http_code_cmd("https://10.0.0.1:8080/health")
