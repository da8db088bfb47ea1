"""Lab fixtures: the lab is brought up once per session and taken down at the end.

Every test under tests/lab is marked `lab` and skipped, with the reason, where the lab cannot run
(not Linux, not root, a tool missing). Set PDFLEET_LAB_KEEP=1 to leave the lab up after the session.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.fleet.roles import apt_packages
from pdfleet.lab.control import Lab, down, up
from pdfleet.lab.paths import LabPaths
from pdfleet.lab.system import REQUIRED_TOOLS
from roles import REGISTRY
from tests.lab.helpers import REPO_ROOT, LabHandle

LAB_DIR = Path(__file__).resolve().parent


# The order of the lab files: one provision from scratch per session, every later file on that fleet.
# infra takes the lab down and up (leaving it bare), then provision's first test converges lab-cross
# from scratch (asserting every host changed); molecule's scenarios end with the lab booted bare, so
# they run after every other lab test.
FIRST = ("test_lab_infra.py", "test_lab_provision.py")
LAST = "test_lab_molecule.py"


def file_rank(name: str) -> int:
    """Where a lab test file runs: FIRST in their order, then the rest (stable sort: file order), LAST."""
    if name in FIRST:
        return FIRST.index(name)
    return len(FIRST) + (name == LAST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test in this directory as a lab test, and order the files (see FIRST)."""
    for item in items:
        if LAB_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.lab)
    items.sort(key=lambda item: file_rank(Path(str(item.path)).name))


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


@pytest.fixture(scope="session")
def lab_def() -> Lab:
    """The lab of this clone (state under /var/lib/pdfleet-lab, hosts from inventory/lab.yml)."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    return Lab(LabPaths(), REPO_ROOT / "inventory" / "lab.yml", apt_packages(REGISTRY))


@pytest.fixture(scope="session")
def lab(lab_def: Lab) -> Iterator[LabHandle]:
    """A running lab for the whole session (built cold if need be), removed at the end."""
    result = up(lab_def, progress=lambda message: print(f"lab: {message}", file=sys.stderr))
    yield LabHandle(lab_def, result.hosts)
    if os.environ.get("PDFLEET_LAB_KEEP") != "1":
        down(lab_def)
