"""The controller's live state on disk: `state.json` (replaced atomically: temp file + rename) and
`history.jsonl` (the audit log: every transition and measurement, one JSON object a line), under one
lock, so the controller's tick and an operator's command never interleave."""

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
        try:
            return RolloutState.model_validate_json(text)
        except PydanticValidationError as exc:
            raise ValidationError(
                f"{path}: not a rollout state ({exc.error_count()} problems); "
                "move it away to start over from the gateways' policy"
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
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as out:
            out.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))

    def history(self, last: int = 0) -> list[dict[str, Any]]:
        """The audit log's events (the last `last` of them when > 0)."""
        try:
            lines = (self.directory / HISTORY).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        events = [json.loads(line) for line in lines if line.strip()]
        return events[-last:] if last > 0 else events
