"""What lab tests share: the repo root and the running lab as tests see it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pdfleet.lab.control import Lab, up
from pdfleet.lab.hosts import LabHost, ssh_run
from pdfleet.lab.paths import LabPaths
from pdfleet.model.inventory import Inventory, load_inventory

REPO_ROOT = Path(__file__).resolve().parents[2]


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
