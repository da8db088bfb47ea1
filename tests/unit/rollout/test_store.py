"""The state store: the state file replaced whole (0600), the audit log appended (0600), the lock
refused to a second holder after its timeout, a corrupt state file named with what to do."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pdfleet.errors import PdfleetError, ValidationError
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.machine import initial_state
from pdfleet.rollout.store import Store


def test_state_and_history_round_trip_with_private_modes(tmp_path: Path) -> None:
    store = Store(tmp_path / "rollout")
    assert store.load() is None and store.history() == []
    state = initial_state("colocated", StageSpec(short=0, long=0), 3)
    store.save(state)
    assert store.load() == state
    assert os.stat(tmp_path / "rollout" / "state.json").st_mode & 0o777 == 0o600
    assert os.stat(tmp_path / "rollout").st_mode & 0o777 == 0o700
    store.record([{"at": 1.0, "event": "submitted"}, {"at": 2.0, "event": "step", "step": 1}])
    store.record([{"at": 3.0, "event": "succeeded"}])
    assert [e["event"] for e in store.history()] == ["submitted", "step", "succeeded"]
    assert [e["event"] for e in store.history(last=1)] == ["succeeded"]
    assert os.stat(tmp_path / "rollout" / "history.jsonl").st_mode & 0o777 == 0o600
    assert not [p for p in (tmp_path / "rollout").iterdir() if p.name.startswith(".state-")]


def test_the_lock_is_exclusive(tmp_path: Path) -> None:
    store = Store(tmp_path)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.locked():
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    with pytest.raises(PdfleetError, match="locked"), store.locked(timeout_s=0.2):
        pass
    release.set()
    thread.join(10)
    with store.locked(timeout_s=1):
        pass


def test_a_corrupt_state_file_says_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text('{"phase": "flying"}')
    with pytest.raises(ValidationError, match="not a rollout state.*move it away"):
        Store(tmp_path).load()
