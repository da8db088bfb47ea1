"""Shared pieces of the role tests: deployments of the shipped profiles with fixed key hashes."""

from __future__ import annotations

import shlex
from pathlib import Path

from pdfleet.fleet.deployment import Deployment
from tests.unit.fleet.helpers import deploy

REPO = Path(__file__).resolve().parents[3]


def deployment(profile: str, inventory: str = "inventory/lab.yml") -> Deployment:
    """A deployment of a shipped profile on a shipped inventory, with the test key hashes."""
    return deploy(profile, REPO / inventory)


def exec_start_argv(unit_text: str) -> list[str]:
    """A rendered unit's ExecStart as argv (systemd's quoting of our output is a subset of POSIX shell's)."""
    line = next(ln for ln in unit_text.splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))
