"""Service checks: every unit installed, enabled, active; ports listening; /health; env files 0600;
no key in any unit file or command line. Unit state and /health are the unit-health fact, read once per
host for both checks; the listening ports, and the unit files with their main processes' command lines, are
one command each per host (not one per port and three per unit: ~2 s of round trips a host)."""

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


def listening_ports(ss_output: str) -> set[int]:
    """The TCP ports `ss -Hltn` lists as listening, on whichever address (units bind the host's own)."""
    ports: set[int] = set()
    for line in ss_output.splitlines():
        cols = line.split()
        port = cols[3].rpartition(":")[2] if len(cols) > 3 else ""
        if port.isdigit():
            ports.add(int(port))
    return ports


def test_ports_listening(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = [(u.unit, port) for u in units(verify, pd_host) if (port := u.port)]
    if not found:
        pytest.skip("no unit with a known TCP port on this host")
    out = target.run("ss -Hltn")
    assert out.rc == 0, f"ss -Hltn failed (exit {out.rc}): {out.stderr.strip()}"
    open_ports = listening_ports(out.stdout)
    closed = [f"{unit}:{port}" for unit, port in found if port not in open_ports]
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


UNIT_MARK = "--- pdfleet unit: "
CMDLINE_MARK = "--- pdfleet command line"


def unit_dump_command(names: list[str]) -> str:
    """One shell command printing, for each unit, a marked name line, its unit file (`systemctl cat`), a mark,
    and its main process's command line (nothing for a unit with no running process)."""
    quoted = " ".join(shlex.quote(name) for name in names)
    return (
        f'for u in {quoted}; do echo "{UNIT_MARK}$u"; systemctl cat "$u" 2>/dev/null; echo "{CMDLINE_MARK}"; '
        'p=$(systemctl show -p MainPID --value "$u"); '
        "case \"$p\" in ''|0|*[!0-9]*) ;; *) tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null; echo ;; esac; done"
    )


def parse_unit_dump(stdout: str) -> dict[str, tuple[str, str]]:
    """{unit: (unit file, command line)} from unit_dump_command's output."""
    dumped: dict[str, tuple[str, str]] = {}
    for chunk in stdout.split(UNIT_MARK)[1:]:
        name, _, rest = chunk.partition("\n")
        text, _, cmdline = rest.partition(CMDLINE_MARK + "\n")
        dumped[name] = (text, cmdline.strip())
    return dumped


def key_leaks(unit: str, text: str, cmdline: str, secrets: list[str]) -> list[str]:
    """What of an API key shows in a unit's file or its command line: an --api-key flag, an env file's key."""
    leaks = []
    for where, content in (("unit file", text), ("command line", cmdline)):
        if "--api-key" in content:
            leaks.append(f"{unit} {where} has --api-key")
        if any(s in content for s in secrets):
            leaks.append(f"{unit} {where} contains a key from an env file")
    return leaks


def test_no_key_in_units_or_cmdline(verify: VerifyPlugin, pd_host: Host, target: Any) -> None:
    found = units(verify, pd_host)
    envs = target.run(f"cat {CONFIG_DIR}/*.env {CONFIG_DIR}/*/*.env 2>/dev/null")
    secrets = secret_values(envs.stdout)
    dump = target.run(unit_dump_command([unit.unit for unit in found]))
    assert dump.rc == 0, f"reading the unit files failed (exit {dump.rc}): {dump.stderr.strip()}"
    dumped = parse_unit_dump(dump.stdout)
    leaks = []
    for unit in found:
        text, cmdline = dumped.get(unit.unit, ("", ""))
        leaks += key_leaks(unit.unit, text, cmdline, secrets)
    assert not leaks, "; ".join(leaks)
