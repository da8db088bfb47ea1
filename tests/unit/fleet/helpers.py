"""Shared pieces of the fleet tests."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import Deployment, load_deployment
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile_loader import list_profiles, load_profile
from roles import REGISTRY

REPO = Path(__file__).resolve().parents[3]
# Each shipped profile's example inventory.
EXAMPLES = {
    "colocated": "inventory/examples/colocated.yml",
    "same-host-pcie": "inventory/examples/same-host-pcie.yml",
    "cross-rdma": "inventory/examples/cross-rdma.yml",
}
# Fixed key hashes, so rendered files do not depend on the keys generated on this machine.
TEST_SECRETS = GatewaySecrets(client_sha256="1" * 64, admin_sha256="2" * 64)


def fleet_of(profile: str, inventory: Path | None = None) -> Deployment:
    """The deployment of a shipped profile on an inventory (default: its example), with the test keys."""
    inv = inventory or REPO / EXAMPLES[profile]
    return load_deployment(profile, inv, REPO / "profiles", REPO / "templates", REGISTRY,
                           gateway_secrets=TEST_SECRETS)


def profile_inventory_pairs() -> list[tuple[str, Path]]:
    """Every (profile, inventory) in the repo that validates together: what an operator could deploy."""
    inventories = sorted((REPO / "inventory").rglob("*.yml"))
    pairs = []
    for name in list_profiles(REPO / "profiles"):
        profile = load_profile(name, REPO / "profiles")
        for inv_path in inventories:
            try:
                check_against_inventory(profile, load_inventory(inv_path))
            except ValidationError:
                continue
            pairs.append((name, inv_path))
    return pairs


def third_party_imports(files: Iterable[Path]) -> set[str]:
    """Top-level names of the non-stdlib, non-pdfleet modules these files import."""
    found: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name != "pdfleet" and name not in sys.stdlib_module_names}
