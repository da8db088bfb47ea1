"""The lab's record: what up created, and which inventory it booted, survive a save and a load."""

from __future__ import annotations

from pathlib import Path

from pdfleet.lab.state import LabState


def test_the_booted_inventory_is_remembered(tmp_path: Path) -> None:
    state = LabState(tmp_path / "state.json", bridge=True, inventory="/repo/inventory/lab-16.yml")
    state.save()
    again = LabState.load(tmp_path / "state.json")
    assert (again.bridge, again.inventory) == (True, "/repo/inventory/lab-16.yml")
    (tmp_path / "state.json").write_text('{"bridge": true, "inventory": 7}')
    assert LabState.load(tmp_path / "state.json").inventory is None  # not a path: ignored
