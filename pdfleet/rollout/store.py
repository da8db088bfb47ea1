"""The controller's live state on disk: `state.json` (replaced atomically: temp file + rename) and
`history.jsonl` (the audit log: every transition, measurement and gateway write, one JSON object a
line), under one lock held only to read, decide and write the state (never across a network call), so
an operator's command waits milliseconds, not for Prometheus or a gateway.

A state file that cannot be read (not UTF-8, a directory, not a state) is one line naming the file and
what to do; a torn line of the audit log (a write cut by a kill) is reported as such, never a traceback."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import ValidationError as PydanticValidationError

from pdfleet.errors import PdfleetError, ValidationError
from pdfleet.rollout.machine import Event, RolloutState

STATE = "state.json"
HISTORY = "history.jsonl"
LOCK = "lock"
MOVE_AWAY = "move it away to start over from the gateways' policy"


class Store:
    """One state directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @contextlib.contextmanager
    def locked(self, timeout_s: float = 30.0) -> Iterator[None]:
        """Hold the directory's lock (an flock on `lock`), waiting up to timeout_s."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise PdfleetError(
                            f"{self.directory}: the rollout state is locked (the controller "
                            f"is busy); try again"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def load(self) -> RolloutState | None:
        """The saved state, or None when there is none yet."""
        path = self.directory / STATE
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            raise ValidationError(f"{path}: not a rollout state (not UTF-8 text); {MOVE_AWAY}") from None
        except OSError as exc:
            raise ValidationError(
                f"{path}: cannot read the rollout state: {exc.strerror}; {MOVE_AWAY}"
            ) from None
        try:
            return RolloutState.model_validate_json(text)
        except PydanticValidationError as exc:
            raise ValidationError(
                f"{path}: not a rollout state ({exc.error_count()} problems); {MOVE_AWAY}"
            ) from None

    def save(self, state: RolloutState) -> None:
        """Replace state.json in one rename (0600)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".state-", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(state.model_dump_json(indent=1))
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.directory / STATE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def record(self, events: list[Event]) -> None:
        """Append events to the audit log."""
        if not events:
            return
        path = self.directory / HISTORY
        text = "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise ValidationError(f"{path}: cannot write the audit log: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":  # a line torn by a kill: end it first
                text = "\n" + text
            os.write(fd, text.encode("utf-8"))  # one append: lines of concurrent writers never mix
            os.fsync(fd)
        finally:
            os.close(fd)

    def history(self, last: int = 0) -> list[dict[str, Any]]:
        """The audit log's events (the last `last` of them when > 0); a line that is not an event (torn
        by a kill mid-write, or not UTF-8) is an `unreadable` event naming its line, so nothing is hidden."""
        path = self.directory / HISTORY
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ValidationError(f"{path}: cannot read the audit log: {exc.strerror}") from None
        events = [_event(line, n) for n, line in enumerate(raw.splitlines(), 1) if line.strip()]
        return events[-last:] if last > 0 else events


def _event(line: bytes, number: int) -> dict[str, Any]:
    """One audit log line as an event."""
    try:
        event = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError is a ValueError too
        event = None
    if isinstance(event, dict) and "event" in event:
        return event
    return {"event": "unreadable", "line": number, "reason": "not a JSON event (a write cut short?)"}


def migrate_legacy(state_dir: Path, first: str) -> bool:
    """Move a state from before rollouts went by model (state.json and history.jsonl in state_dir
    itself) into the first model's subdirectory, under the old directory's lock, history first, so a
    kill between the two renames leaves a state the next start moves; True when something moved. A
    model that already has a state of its own keeps it (the old files stay where they are)."""
    old = Store(state_dir)
    new = state_dir / first
    with old.locked():
        if not (state_dir / STATE).exists() or (new / STATE).exists():
            return False
        new.mkdir(parents=True, exist_ok=True, mode=0o700)
        for name in (HISTORY, STATE):
            if (state_dir / name).exists():
                os.replace(state_dir / name, new / name)
    return True
