"""Lab fixtures: the lab is brought up once per session and taken down at the end.

Every test under tests/lab is marked `lab` and skipped, with the reason, where the lab cannot run
(not Linux, not root, a tool missing). Set PDFLEET_LAB_KEEP=1 to leave the lab up after the session.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdfleet.lab.control import Lab, down, up
from pdfleet.lab.hosts import LabHost, ssh_run
from pdfleet.lab.paths import LabPaths
from pdfleet.lab.system import REQUIRED_TOOLS
from pdfleet.model.inventory import Inventory, load_inventory

REPO_ROOT = Path(__file__).resolve().parents[2]
LAB_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this directory as a lab test."""
    for item in items:
        if LAB_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.lab)


def lab_unavailable() -> str | None:
    """Why the lab cannot run here, or None."""
    if not sys.platform.startswith("linux"):
        return f"the lab needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the lab needs root (systemd-nspawn, a bridge, overlay mounts)"
    missing = sorted({pkg for tool, pkg in REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        return f"the lab needs: apt-get install -y {' '.join(missing)}"
    return None


@dataclass(frozen=True)
class LabHandle:
    """The running lab as tests see it."""

    lab: Lab
    hosts: tuple[LabHost, ...]

    @property
    def paths(self) -> LabPaths:
        return self.lab.paths

    @property
    def inventory(self) -> Inventory:
        return load_inventory(self.lab.inventory)

    def ssh(self, host: LabHost, command: str, timeout: float = 60.0) -> tuple[int, str, str]:
        """Run a command on a lab host as the lab user (strict host-key checking)."""
        return ssh_run(host.address, self.paths.key_file, self.paths.known_hosts, command, timeout)

    def up(self) -> None:
        """Bring the lab (back) up; cheap when it is already running."""
        up(self.lab)


@pytest.fixture(scope="session")
def lab_def() -> Lab:
    """The lab of this clone (state under /var/lib/pdfleet-lab, hosts from inventory/lab.yml)."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    return Lab(LabPaths(), REPO_ROOT, REPO_ROOT / "inventory" / "lab.yml")


@pytest.fixture(scope="session")
def lab(lab_def: Lab) -> Iterator[LabHandle]:
    """A running lab for the whole session (built cold if need be), removed at the end."""
    result = up(lab_def, progress=lambda message: print(f"lab: {message}", file=sys.stderr))
    yield LabHandle(lab_def, result.hosts)
    if os.environ.get("PDFLEET_LAB_KEEP") != "1":
        down(lab_def)
