"""Golden renders of every shipped single-model profile on the inventory it is used with: what provision
installed before profiles could hold several models (issue 24), so the move to per-model specs is proven
byte-identical (test_render.py compares). Regenerate, only for an intended change, with:

    PYTHONPATH=. .venv/bin/python -m tests.unit.fleet.golden
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pdfleet.fleet.provision import render_fleet
from tests.unit.fleet.helpers import REPO, deploy

GOLDEN = Path(__file__).parent / "golden"
# Each shipped single-model profile and the inventory it is deployed with.
PAIRS = {
    "colocated": "inventory/examples/colocated.yml",
    "same-host-pcie": "inventory/examples/same-host-pcie.yml",
    "cross-rdma": "inventory/examples/cross-rdma.yml",
    "lab-colocated": "inventory/lab.yml",
    "lab-cross": "inventory/lab.yml",
    "lab-cross-mooncake": "inventory/lab.yml",
    "lab-same-host": "inventory/lab-same-host.yml",
    "lab-16": "inventory/lab-16.yml",
}
HOST_VERSION = "HOST-VERSION"  # the host wheel's version is a hash of host code: it moves with any edit


def rendered(profile: str) -> dict[str, str]:
    """Every file provision would install for a profile, as `<host><absolute path>` -> content."""
    deployment = deploy(profile, REPO / PAIRS[profile])
    files = render_fleet(deployment, deployment.inventory.hosts.values())
    return {
        f"{host}{f.path}": f.content.replace(deployment.host_version, HOST_VERSION)
        for host, host_files in files.items()
        for f in host_files
    }


def golden(profile: str) -> dict[str, str]:
    """The stored render of a profile, keyed as rendered() keys it."""
    root = GOLDEN / profile
    files = (p for p in sorted(root.rglob("*")) if p.is_file())
    return {str(p.relative_to(root)): p.read_text(encoding="utf-8") for p in files}


def write() -> None:
    """Replace the stored renders with today's."""
    for profile in PAIRS:
        root = GOLDEN / profile
        shutil.rmtree(root, ignore_errors=True)
        for key, content in rendered(profile).items():
            dest = root / key
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(content, encoding="utf-8")


if __name__ == "__main__":
    write()
