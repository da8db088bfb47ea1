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
from pdfleet.rollout.store import Store, migrate_legacy


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


@pytest.mark.parametrize("kind", ["latin-1", "directory"])
def test_an_unreadable_state_file_is_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "state.json"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b'{"phase": "id\xe9le"}')
    with pytest.raises(ValidationError) as err:
        Store(tmp_path).load()
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "move it away" in message and "\n" not in message


def test_a_torn_audit_line_is_reported_and_the_next_event_starts_on_its_own_line(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.record([{"at": 1.0, "event": "write", "gateway": "gw0"}])
    with open(tmp_path / "history.jsonl", "ab") as out:
        out.write(b'{"at": 2.0, "event": "wro\xff')  # the controller killed mid-line
    store.record([{"at": 3.0, "event": "resuming"}])
    events = store.history()
    assert [e["event"] for e in events] == ["write", "unreadable", "resuming"]
    assert events[1]["line"] == 2
    (tmp_path / "history.jsonl").unlink()
    (tmp_path / "history.jsonl").mkdir()
    with pytest.raises(ValidationError, match="history.jsonl: cannot write the audit log"):
        store.record([{"at": 4.0, "event": "x"}])
    with pytest.raises(ValidationError, match="history.jsonl: cannot read the audit log"):
        store.history()


def test_a_state_from_before_models_moves_to_the_first_model_once(tmp_path: Path) -> None:
    """state.json and history.jsonl in the state dir itself (one model, before rollouts went by model)
    move to <state dir>/<first model>/; a second start moves nothing; a model that already has a state
    keeps it; a kill between the two renames (history moved, state not) is finished by the next start."""
    old = Store(tmp_path)
    state = initial_state("long-prompts", StageSpec(short=0, long=100), 7)
    old.save(state)
    old.record([{"at": 1.0, "event": "applied", "version": 7}])
    assert migrate_legacy(tmp_path, "llama")
    moved = Store(tmp_path / "llama")
    assert moved.load() == state and [e["event"] for e in moved.history()] == ["applied"]
    assert old.load() is None and not migrate_legacy(tmp_path, "llama")
    assert os.stat(tmp_path / "llama").st_mode & 0o777 == 0o700
    old.save(state.model_copy(update={"version": 3}))  # a stale file beside a model's own state
    assert not migrate_legacy(tmp_path, "llama") and moved.load() == state
    (tmp_path / "state.json").rename(tmp_path / "kept.json")
    (tmp_path / "llama" / "state.json").rename(tmp_path / "state.json")  # cut after history moved
    assert migrate_legacy(tmp_path, "llama") and moved.load() == state
