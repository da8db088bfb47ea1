"""The live layout on the fleet (pdfleet.fleet.live_layout's rule): read from, written to and audited on
every gateway host of the inventory, beside the live stage, through a connection per host (SSH on a
fleet, this machine's shell in the tests). What the texts mean is live_layout's; this module only moves
them.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import ConnectError
from pdfleet.fleet.live_layout import FLEET_LAYOUT_DIR, HostPools, agreed_layout, audit_line, fleet_paths
from pdfleet.model.inventory import Host
from pdfleet.ops.ssh import Transport

ABSENT = 3  # the read's exit code when the host keeps no layout
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class FleetLayout:
    """One profile's live layout on the gateway hosts (`keepers`), reached with `connect`."""

    keepers: Sequence[Host]
    connect: Callable[[Host], Transport]
    profile: str
    root: str = FLEET_LAYOUT_DIR
    sudo: bool = True  # the directory is root's on a fleet

    @property
    def path(self) -> str:
        return fleet_paths(self.profile, self.root)[0]

    @property
    def audit_path(self) -> str:
        return fleet_paths(self.profile, self.root)[1]

    def texts(self) -> dict[str, str | None]:
        """Each gateway host's layout file text (None: it keeps none)."""
        path = shlex.quote(self.path)
        return {
            host.name: self._run(host, f"[ -e {path} ] || exit {ABSENT}; cat {path}", absent_ok=True)
            for host in self.keepers
        }

    def read(self) -> HostPools | None:
        """The live layout the gateway hosts keep (None: none keeps one; refused if two disagree)."""
        return agreed_layout(self.texts(), self.path)

    def write(self, text: str | None) -> None:
        """Keep `text` as the live layout on every gateway host (None: remove it, the inventory's layout
        is the fleet's again). Written whole, then renamed over the old file."""
        path = shlex.quote(self.path)
        if text is None:
            self._each(f"rm -f {path}")
            return
        tmp = shlex.quote(f"{self.path}.tmp")
        self._each(f"mkdir -p {shlex.quote(self.root)} && cat > {tmp} && mv {tmp} {path}", text)

    def record(self, event: Mapping[str, Any]) -> None:
        """Append one audit line (with its time) to the audit log on every gateway host."""
        line = audit_line(event, time.time())
        self._each(f"mkdir -p {shlex.quote(self.root)} && cat >> {shlex.quote(self.audit_path)}", line)

    def audit(self) -> dict[str, str]:
        """Each gateway host's audit log text ('' where it has none)."""
        path = shlex.quote(self.audit_path)
        return {
            host.name: self._run(host, f"[ -e {path} ] || exit {ABSENT}; cat {path}", absent_ok=True) or ""
            for host in self.keepers
        }

    def _each(self, cmd: str, stdin: str | None = None) -> None:
        for host in self.keepers:
            self._run(host, cmd, stdin=stdin)

    def _run(self, host: Host, cmd: str, stdin: str | None = None, absent_ok: bool = False) -> str | None:
        """Run one command on a gateway host (its stdin `stdin`): its output, None for an absent file."""
        conn = self.connect(host)
        try:
            if stdin is None:
                out = conn.run(cmd, sudo=self.sudo, timeout=TIMEOUT_S)
            else:
                out = conn.send(cmd, [stdin.encode()], sudo=self.sudo, timeout=TIMEOUT_S)
        finally:
            conn.close()
        if absent_ok and out.rc == ABSENT:
            return None
        if out.rc != 0:
            raise ConnectError(
                f"{host.name}: the live layout in {self.root}: `{cmd}` failed "
                f"(exit {out.rc}): {out.stderr.strip() or out.stdout.strip()}"
            )
        return out.stdout
