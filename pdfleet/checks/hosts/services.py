"""Service checks: every unit installed, enabled, active; ports listening; /health; env files 0600;
no key in any unit file or command line. Unit state and /health are the unit-health fact, read once per
host for both checks."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from pdfleet.checks.verify import VerifyPlugin, secret_values
from pdfleet.fleet.host_layout import CONFIG_DIR
from pdfleet.fleet.roles import ManagedUnit
from pdfleet.model.inventory import Host


def units(verify: VerifyPlugin, pd_host: Host) -> list[ManagedUnit]:
    found = verify.units(pd_host)
    if not found:
        pytest.skip("runs no pdfleet unit under this profile")
    return found


def test_units_installed_enabled_active(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    units(verify, pd_host)
    bad = []
    for unit, state in verify.unit_states(pd_host):  # one command for the host's units, matched by name
        if isinstance(state, str):
            bad.append(f"{unit.unit} not installed ({state})")
        elif state.load_state != "loaded":
            bad.append(f"{unit.unit} not installed ({state.load_state})")
        elif not state.enabled or state.active_state != "active":
            bad.append(f"{unit.unit} {state.unit_file_state}/{state.active_state}")
    assert not bad, "; ".join(bad)


def listening(target: Any, port: int) -> bool:
    """Some socket listens on TCP `port`, on whichever address (units bind the host's own address)."""
    out = target.run(f"ss -Hltn 'sport = :{int(port)}'")
    return out.rc == 0 and bool(out.stdout.strip())


def test_ports_listening(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = [(u.unit, port) for u in units(verify, pd_host) if (port := u.port)]
    if not found:
        pytest.skip("no unit with a known TCP port on this host")
    closed = [f"{unit}:{port}" for unit, port in found if not listening(target, port)]
    assert not closed, f"not listening: {', '.join(closed)}"


def test_health_answers(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    checked = [(u, state) for u, state in verify.unit_states(pd_host) if u.health_url]
    if not checked:
        pytest.skip("no unit with a /health endpoint on this host")
    bad = [
        f"{unit.health_url} ({state if isinstance(state, str) else state.health})"
        for unit, state in checked
        if isinstance(state, str) or state.health != "ok"
    ]
    assert not bad, f"/health does not answer: {'; '.join(bad)}"


def test_env_files_mode_0600(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    units(verify, pd_host)
    listing = target.run(f"find {CONFIG_DIR} -name '*.env' -printf '%m %u %p\\n' 2>/dev/null")
    files = [line.split(" ", 2) for line in listing.stdout.splitlines() if line.strip()]
    if not files:
        pytest.skip(f"no env files under {CONFIG_DIR}")
    bad = [f"{path} {mode} {owner}" for mode, owner, path in files if mode != "600" or owner != "root"]
    assert not bad, f"env files must be 0600 root: {'; '.join(bad)}"


def test_no_key_in_units_or_cmdline(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = units(verify, pd_host)
    envs = target.run(f"cat {CONFIG_DIR}/*.env {CONFIG_DIR}/*/*.env 2>/dev/null")
    secrets = secret_values(envs.stdout)
    leaks = []
    for unit in found:
        name = shlex.quote(unit.unit)
        text = target.run(f"systemctl cat {name} 2>/dev/null").stdout
        pid = target.run(f"systemctl show -p MainPID --value {name}").stdout.strip()
        cmdline = ""
        if pid.isdigit() and pid != "0":
            cmdline = target.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
        for where, content in (("unit file", text), ("command line", cmdline)):
            if "--api-key" in content:
                leaks.append(f"{unit.unit} {where} has --api-key")
            if any(s in content for s in secrets):
                leaks.append(f"{unit.unit} {where} contains a key from an env file")
    assert not leaks, "; ".join(leaks)
