"""Plain helpers tests across tests/unit packages share: what the `sshd` fixture (conftest.py) runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Sshd:
    """A running test sshd and the files a client needs to reach it."""

    port: int
    key_file: Path
    known_hosts: Path
    host_key_pub: Path
    workdir: Path
