"""Shared pieces of the role tests: deployments of the shipped profiles with fixed key hashes."""

from __future__ import annotations

import shlex
from pathlib import Path

from pdfleet.fleet.deployment import Deployment, load_deployment
from pdfleet.fleet.secrets import GatewaySecrets
from roles import REGISTRY

REPO = Path(__file__).resolve().parents[3]
# Fixed key hashes, so rendered files do not depend on the keys generated on this machine.
TEST_SECRETS = GatewaySecrets(client_sha256="1" * 64, admin_sha256="2" * 64)


def deployment(profile: str, inventory: str = "inventory/lab.yml") -> Deployment:
    """A deployment of a shipped profile on a shipped inventory, with the test key hashes."""
    return load_deployment(
        profile,
        REPO / inventory,
        REPO / "profiles",
        REPO / "templates",
        REGISTRY,
        gateway_secrets=TEST_SECRETS,
    )


def exec_start_argv(unit_text: str) -> list[str]:
    """A rendered unit's ExecStart as argv (systemd's quoting of our output is a subset of POSIX shell's)."""
    line = next(ln for ln in unit_text.splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))
