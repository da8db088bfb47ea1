"""Plain helpers tests across tests/unit packages share: what the `sshd` and `systemd` fixtures (conftest.py)
run."""

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


@dataclass(frozen=True)
class UserSystemd:
    """A private systemd instance (`systemd --user` in its own mount namespace) and how to reach it:
    `bin` holds a `systemctl` that talks to it, so a command run with `bin` first on PATH and `env` set
    asks this instance exactly as a host's `systemctl` asks its own."""

    units_dir: Path  # where unit files go (then `systemctl daemon-reload`)
    bin: Path
    env: dict[str, str]


@dataclass(frozen=True)
class SystemdUnits:
    """Units the `systemd_units` fixture runs: web.service (its /health answers 200 on `port`; alias
    www.service) and down.service (failed); `closed_port` has no listener."""

    port: int
    closed_port: int

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/health"
