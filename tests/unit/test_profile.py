"""Profiles: the shipped ones load and fit their example inventories; extends, defaults, port rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile_loader import list_profiles, load_profile
from pdfleet.model.survey import survey_profiles

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"
SHIPPED = ["colocated", "same-host-pcie", "cross-rdma"]


def test_shipped_profiles_are_listed_and_bases_are_not() -> None:
    names = list_profiles(PROFILES)
    assert set(SHIPPED) <= set(names)
    assert not [n for n in names if n.startswith("_")]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_fits_its_example_inventory(name: str) -> None:
    profile = load_profile(name, PROFILES)
    check_against_inventory(profile, load_inventory(REPO / f"inventory/examples/{name}.yml"))
    assert profile.name == name and profile.source == PROFILES / f"{name}.yml"
    assert profile.extends == "_base"


def test_operator_values_for_prefill_and_decode() -> None:
    profile = load_profile("cross-rdma", PROFILES)
    assert profile.model.id == "meta-llama/Llama-3.1-8B-Instruct"
    assert profile.vllm.version == "0.11.0" and profile.kv_transfer.connector == "NixlConnector"
    prefill, decode = profile.pools.prefill, profile.pools.decode
    assert prefill is not None and decode is not None
    assert (prefill.port, prefill.max_num_batched_tokens, prefill.gpu_memory_utilization) == (
        8100,
        8192,
        0.85,
    )
    assert (decode.port, decode.max_num_batched_tokens, decode.gpu_memory_utilization) == (8200, 2048, 0.90)
    assert prefill.enable_chunked_prefill and decode.enable_chunked_prefill
    assert (prefill.kv_role, decode.kv_role) == ("kv_producer", "kv_consumer")
    assert profile.pools.colocated is None
    assert profile.rdma.enabled and profile.topology == "cross-host"
    colocated = load_profile("colocated", PROFILES)
    assert colocated.pools.colocated is not None and colocated.pools.colocated.port == 8000
    assert colocated.kv_role_for("colocated") is None and colocated.side_channel_port_for("prefill") is None


def test_side_channel_port_rule() -> None:
    profile = load_profile("same-host-pcie", PROFILES)
    kv = profile.kv_transfer
    assert kv.side_channel_port_for("prefill") == kv.side_channel_port == 5600
    assert kv.side_channel_port_for("decode") == 5601
    assert kv.side_channel_port_for("colocated") is None
    assert kv.bootstrap_port_for("prefill") is None  # NixlConnector has no Mooncake bootstrap server


def test_models_are_immutable() -> None:
    profile = load_profile("colocated", PROFILES)
    with pytest.raises(Exception, match="frozen"):
        profile.topology = "same-host"  # type: ignore[misc]


def test_load_by_path_and_extends_merge(tmp_path: Path) -> None:
    (tmp_path / "_common.yml").write_text((PROFILES / "_base.yml").read_text())
    child = tmp_path / "mine.yml"
    child.write_text(
        """
extends: _common
topology: colocated
gateway: {port: 9080}
vllm: {engine: sim}
pools:
  colocated: {port: 8000, gpus: [1], max_num_batched_tokens: 4096, gpu_memory_utilization: 0.5}
"""
    )
    profile = load_profile(str(child), tmp_path / "elsewhere")
    # mappings merge key by key: the child's gateway.port, the base's router_port and stages
    assert profile.gateway.port == 9080 and profile.gateway.router_port == 8090
    assert "long-prompts" in profile.gateway.stages
    assert profile.vllm.engine == "sim" and profile.vllm.version == "0.11.0"
    assert profile.vllm.sim.link == "pcie-gen5"
    assert list_profiles(tmp_path) == ["mine"]


def test_null_in_child_clears_base_key(tmp_path: Path) -> None:
    (tmp_path / "_common.yml").write_text((PROFILES / "_base.yml").read_text())
    (tmp_path / "p.yml").write_text(
        """
extends: _common
topology: colocated
model: {max_model_len: null}
pools:
  colocated: {port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}
"""
    )
    assert load_profile("p", tmp_path).model.max_model_len is None


def test_base_profiles_are_not_runnable() -> None:
    with pytest.raises(ValidationError, match="is a base for `extends:`, not a runnable profile"):
        load_profile("_base", PROFILES)


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
    fitted = {s.name: s.ok for s in survey_profiles(tmp_path, inv, ["cross-rdma", "colocated"])}
    assert fitted == {"cross-rdma": True, "colocated": False}


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real `invoke` of this venv from the repo root, as an operator would."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "invoke"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_invoke_profiles_lists_and_exits_zero() -> None:
    proc = _invoke("profiles")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["PROFILE", "TOPOLOGY", "ENGINE", "CONNECTOR", "VLLM", "STATUS"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.strip()}
    assert rows["cross-rdma"] == ["cross-host", "vllm", "NixlConnector", "0.11.0", "ok"]
    assert rows["colocated"] == ["colocated", "vllm", "-", "0.11.0", "ok"]
    assert "_base" not in rows


def test_invoke_profiles_fails_on_invalid_profile(tmp_path: Path) -> None:
    (tmp_path / "_base.yml").write_text((PROFILES / "_base.yml").read_text())
    (tmp_path / "colocated.yml").write_text((PROFILES / "colocated.yml").read_text())
    (tmp_path / "bad.yml").write_text(
        "extends: colocated\npools: {colocated: {gpu_memory_utilization: 0.99}}\n"
    )
    proc = _invoke("profiles", "--profiles-dir", str(tmp_path))
    assert proc.returncode == 1
    assert f"{tmp_path / 'bad.yml'}: pools.colocated.gpu_memory_utilization: must be <= 0.98" in proc.stdout
    assert "1 of 2 profiles invalid: bad" in proc.stderr


def test_invoke_profiles_with_inventory_runs_semantic_checks() -> None:
    inv = "inventory/examples/cross-rdma.yml"
    ok = _invoke("profiles", "--inventory", inv, "--profile", "cross-rdma")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"ok (fits {inv})" in ok.stdout
    bad = _invoke("profiles", "--inventory", inv, "--profile", "colocated")
    assert bad.returncode == 1
    assert f"profiles/colocated.yml: topology: colocated needs hosts in group colocated; {inv}" in bad.stdout


def test_invoke_profiles_unknown_inventory_is_one_clean_error() -> None:
    proc = _invoke("profiles", "--inventory", "inventory/nope.yml")
    assert proc.returncode != 0
    assert "inventory/nope.yml: file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def _fits(profile_name: str, inventory: Path) -> bool:
    try:
        check_against_inventory(load_profile(profile_name, PROFILES), load_inventory(inventory))
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("name", list_profiles(PROFILES))
def test_every_profile_fits_some_inventory_in_the_repo(name: str) -> None:
    """A profile no inventory in the repo can run is a broken example (lab profiles included)."""
    inventories = sorted((REPO / "inventory").glob("**/*.yml"))
    assert any(_fits(name, inv) for inv in inventories), f"{name} fits none of {inventories}"


def test_connector_registry_and_suggestions() -> None:
    from pdfleet.model import connectors

    assert connectors.parse_version("0.11.0") == (0, 11, 0)
    assert connectors.parse_version("0.11.0rc2") == (0, 11, 0)
    assert connectors.parse_version("0.11") is None and connectors.parse_version("latest") is None
    v011 = connectors.registered((0, 11, 0))
    assert v011 is not None and "NixlConnector" in v011 and "MooncakeConnector" not in v011
    assert "OffloadingConnector" in v011 and "OffloadingConnector" not in (
        connectors.registered((0, 10, 2)) or ()
    )
    assert connectors.registered((0, 9, 0)) is None
    assert connectors.suggest("MooncakeTransferEngine") == "MooncakeConnector"
    assert connectors.suggest("nixlconnector") == "NixlConnector"
    assert connectors.suggest("LMCacheConnector") == "LMCacheConnectorV1"
    assert connectors.suggest("Zzzz") is None
    assert connectors.check_connector("NixlConnector", (0, 11, 0)) is None
    assert connectors.check_connector("MooncakeConnector", (0, 15, 0)) is None
