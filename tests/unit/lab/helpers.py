"""Shared pieces of the lab tests: the repo's lab inventory and a Lab over it."""

from __future__ import annotations

from pathlib import Path

from pdfleet.fleet.roles import apt_packages
from pdfleet.lab.control import Lab
from pdfleet.lab.paths import LabPaths
from roles import REGISTRY

REPO = Path(__file__).resolve().parents[3]
LAB_YML = REPO / "inventory" / "lab.yml"


def lab_of(inventory: Path, paths: LabPaths | None = None) -> Lab:
    """A Lab of these hosts, its state under `paths` (default: the real state root, only read)."""
    return Lab(paths or LabPaths(), inventory, apt_packages(REGISTRY))
