"""The live layout on the fleet (pdfleet.fleet.live_layout's rule): read from, written to and audited on
every gateway host of the inventory, beside the live stage, through a connection per host (SSH on a
fleet, this machine's shell in the tests). What the texts mean is live_layout's; this module only moves
them.
"""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pdfleet.errors import ConnectError, ValidationError
from pdfleet.fleet.live_layout import FLEET_LAYOUT_DIR, HostPools, agreed_layout, audit_line, fleet_paths
from pdfleet.model.inventory import Host
from pdfleet.ops.ssh import Transport

ABSENT = 3  # the read's exit code when the host keeps no layout
TIMEOUT_S = 30.0
LOCK_BUSY = 75  # flock's exit when another holds the follower lock


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

    def run_on(self, host: Host, cmd: str) -> str | None:
        """Run one command on a gateway host: its output, None when it fails (a file not there)."""
        conn = self.connect(host)
        try:
            out = conn.run(cmd, sudo=self.sudo, timeout=TIMEOUT_S)
        finally:
            conn.close()
        return out.stdout if out.rc == 0 else None

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


def lock_paths(root: str, profile: str, token: str) -> tuple[str, str, str]:
    """The follower lock's file, its holder's name and one attempt's mark file (under the live layout's
    directory)."""
    base = f"{root}/{profile}.follow"
    return f"{base}.lock", f"{base}.owner", f"{base}.{token}"


def hold_command(root: str, profile: str, owner: str, token: str) -> str:
    """The command that holds the follower lock while its stdin is open: it names the holder and marks
    `held`, or marks `exit N` when it could not take it (N = LOCK_BUSY: another holds it)."""
    lock, who, mark = (shlex.quote(p) for p in lock_paths(root, profile, token))
    hold = f"printf %s {shlex.quote(owner)} > {who}; echo held > {mark}; cat > /dev/null; rm -f {mark}"
    return (
        f"mkdir -p {shlex.quote(root)} && "
        f'{{ flock -n -E {LOCK_BUSY} {lock} sh -c {shlex.quote(hold)} || echo "exit $?" > {mark}; }}'
    )


@dataclass
class FollowerLock:
    """The profile's follower lock (`invoke rebalance --follow/--proposed`: one per profile), held on the
    first gateway host by `flock` around a command whose stdin stays open. Closing that stdin
    (`release`) ends the command and frees the lock; so does this process dying, which closes its
    connection and the stdin with it. `alive` says whether the holding command still runs from here."""

    store: FleetLayout
    owner: str  # who holds it, shown to a follower it refuses
    wait_s: float = 10.0  # for the host to say whether the lock was taken
    _release: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def take(self) -> FollowerLock:
        """Take the lock: ValidationError naming its holder when another follower holds it."""
        if not self.store.keepers:
            raise ValidationError(
                "the inventory has no gateway host: the live layout is kept on the gateway hosts"
            )
        host, token = self.store.keepers[0], uuid.uuid4().hex
        lock, who, mark = lock_paths(self.store.root, self.store.profile, token)
        self._release = threading.Event()
        conn = self.store.connect(host)  # a host that cannot be reached fails here, in the caller
        cmd = hold_command(self.store.root, self.store.profile, self.owner, token)
        self._thread = threading.Thread(target=self._hold, args=(conn, cmd), daemon=True)
        self._thread.start()
        said = self._said(host, mark)
        if said == "held":
            return self
        self.release()
        self.store.run_on(host, f"rm -f {shlex.quote(mark)}")
        if said != f"exit {LOCK_BUSY}":
            raise ConnectError(
                f"{host.name}: the follower lock {lock}: {said or f'no answer in {self.wait_s:g} s'}"
            )
        holder = self.store.run_on(host, f"cat {shlex.quote(who)}") or "who: unknown"
        if holder == self.owner:  # this follower's own hold, whose lost connection the host has not seen end
            raise ConnectError(
                f"{host.name}: the follower lock {lock} is still held by this follower's lost connection"
            )
        raise ValidationError(
            f"another follower carries out {self.store.profile}'s proposals ({holder}; its lock: {lock} on "
            f"{host.name}): run one follower per profile (the lock is freed when that one stops)"
        )

    def release(self) -> None:
        """Free the lock (the holding command's stdin closed); nothing when it is not held."""
        self._release.set()
        if self._thread is not None:
            self._thread.join(TIMEOUT_S)

    def _hold(self, conn: Transport, cmd: str) -> None:
        def stdin() -> Iterator[bytes]:
            self._release.wait()
            yield from ()

        try:
            conn.send(cmd, stdin(), sudo=self.store.sudo, timeout=TIMEOUT_S)
        except (ConnectError, OSError, EOFError):
            pass  # the connection is lost: `alive` turns False and the follower takes the lock again
        finally:
            conn.close()

    def _said(self, host: Host, mark: str) -> str:
        """What the holding command left in its mark file: `held`, `exit N`, or '' (nothing in time)."""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            text = self.store.run_on(host, f"cat {shlex.quote(mark)}")
            if text and text.strip():
                return text.strip()
            time.sleep(0.1)
        return ""
