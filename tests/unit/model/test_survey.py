"""invoke profiles' survey: one status per profile with every problem it has."""

from __future__ import annotations

from pathlib import Path

from pdfleet.model.inventory import load_inventory
from pdfleet.model.survey import survey_profiles
from tests.unit.model.helpers import PROFILES, REPO, SHIPPED


def test_survey_reports_each_profile(tmp_path: Path) -> None:
    for name in SHIPPED:
        (tmp_path / f"{name}.yml").write_text((PROFILES / f"{name}.yml").read_text())
    (tmp_path / "_base.yml").write_text((PROFILES / "_base.yml").read_text())
    (tmp_path / "broken.yml").write_text("extends: _base\ntopology: cross-host\n")
    statuses = {s.name: s for s in survey_profiles(tmp_path)}
    assert set(statuses) == {*SHIPPED, "broken"}
    assert all(statuses[n].ok for n in SHIPPED)
    assert statuses["cross-rdma"].connector == "NixlConnector"
    assert statuses["colocated"].connector == "-"
    assert not statuses["broken"].ok and statuses["broken"].topology == "cross-host"
    assert any("pools.prefill: required key is missing" in p for p in statuses["broken"].problems)
    inv = load_inventory(REPO / "inventory/examples/cross-rdma.yml")
    fitted = {s.name: s.ok for s in survey_profiles(tmp_path, inv, ["cross-rdma", "same-host-pcie"])}
    assert fitted == {"cross-rdma": True, "same-host-pcie": False}
