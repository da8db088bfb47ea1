"""What lab.up has created, recorded as it goes so lab.down removes exactly that, even after a kill."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdfleet.lab.system import ProcessRef, atomic_write


@dataclass
class HostRecord:
    """One container: the nspawn process and the container's init (they can outlive each other)."""

    nspawn: ProcessRef | None = None
    init: ProcessRef | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "nspawn": self.nspawn.to_json() if self.nspawn else None,
            "init": self.init.to_json() if self.init else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostRecord:
        return cls(ProcessRef.from_json(data.get("nspawn")), ProcessRef.from_json(data.get("init")))


@dataclass
class LabState:
    """The lab's record on disk; every mutation is saved immediately by the caller via save()."""

    path: Path
    bridge: bool = False
    inventory: str | None = None  # the inventory lab.up booted (status, ssh and env default to it)
    hosts: dict[str, HostRecord] = field(default_factory=dict)
    servers: dict[str, ProcessRef] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> LabState:
        """The saved state, or an empty one (an unreadable file counts as empty: down cleans by name too)."""
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return cls(path)
        inventory = data.get("inventory")
        state = cls(
            path, bridge=bool(data.get("bridge")), inventory=inventory if isinstance(inventory, str) else None
        )
        for name, rec in (data.get("hosts") or {}).items():
            state.hosts[name] = HostRecord.from_json(rec)
        for name, ref in (data.get("servers") or {}).items():
            parsed = ProcessRef.from_json(ref)
            if parsed:
                state.servers[name] = parsed
        return state

    def save(self) -> None:
        """Write the state atomically."""
        data = {
            "bridge": self.bridge,
            "inventory": self.inventory,
            "hosts": {name: rec.to_json() for name, rec in self.hosts.items()},
            "servers": {name: ref.to_json() for name, ref in self.servers.items()},
        }
        atomic_write(self.path, json.dumps(data, indent=2) + "\n", 0o600)

    def remove(self) -> None:
        """Forget everything (after lab.down has removed it)."""
        self.path.unlink(missing_ok=True)
