"""The `rollout.rebalance:` section: off by default with a minimum of 1 per pool; the automatic mode's
bands, minimums and mode are refused with the file and key path when they cannot work."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.rebalancing import Band, RebalanceSpec
from tests.unit.model.helpers import GOOD, PROFILES

COLOCATED_ONLY = (
    "topology: colocated\npools: {prefill: null, decode: null, colocated: "
    "{port: 8000, gpus: [0], max_num_batched_tokens: 8192, gpu_memory_utilization: 0.9}}\n"
)


def _profile(tmp_path: Path, rebalance: str, more: str = "") -> Profile:
    (tmp_path / "_good.yml").write_text(GOOD)
    path = tmp_path / "p.yml"
    path.write_text("extends: _good\n" + more + "rollout:\n  rebalance:\n" + rebalance)
    return load_profile(str(path), tmp_path)


def test_off_by_default_in_every_shipped_profile() -> None:
    for name in ("cross-rdma", "lab-cross", "lab-16", "colocated"):
        spec = load_profile(name, PROFILES).rollout.rebalance
        assert spec == RebalanceSpec() and spec.mode == "off" and spec.minimums == {}


def test_a_dry_run_section_parses(tmp_path: Path) -> None:
    spec = _profile(
        tmp_path,
        "    mode: dry-run\n    minimums: {decode: 2}\n    cooldown_s: 120\n"
        "    prefill_queue_p95_ms: {high: 800, low: 200}\n",
    ).rollout.rebalance
    assert (spec.mode, dict(spec.minimums), spec.cooldown_s) == ("dry-run", {"decode": 2}, 120)
    assert spec.prefill_queue_p95_ms == Band(high=800, low=200)


def test_mode_on_parses_with_its_window_to_act(tmp_path: Path) -> None:
    spec = _profile(tmp_path, "    mode: on\n    act_within_s: 30\n").rollout.rebalance
    assert (spec.mode, spec.act_within_s) == ("on", 30)
    assert RebalanceSpec().act_within_s == 120
    assert _profile(tmp_path, "    mode: off\n").rollout.rebalance.mode == "off"  # YAML 1.1's booleans


@pytest.mark.parametrize(
    ("rebalance", "more", "expected"),
    [
        ("    mode: auto\n", "", "rollout.rebalance.mode: must be one of 'off', 'dry-run' or 'on'"),
        ("    act_within_s: 0\n", "", "rollout.rebalance.act_within_s: must be > 0"),
        ("    minimums: {decode: 0}\n", "", "rollout.rebalance.minimums.decode: must be >= 1"),
        (
            "    minimums: {colocated: 1}\n",
            "",
            "rollout.rebalance.minimums.colocated: the profile sets no pools",
        ),
        ("    decode_itl_p95_ms: {high: 50, low: 80}\n", "", "low (80) must be below high (50)"),
        ("    reaction_s: -1\n", "", "rollout.rebalance.reaction_s: must be >= 0"),
        ("    colour: blue\n", "", "rollout.rebalance.colour: unknown key"),
        (
            "    colocated_queue_p95_ms: {high: 500, low: 100}\n",
            "pools: {colocated: null}\n",
            "rollout.rebalance.colocated_queue_p95_ms: the profile sets no pools.colocated",
        ),
        (
            "    mode: dry-run\n",
            COLOCATED_ONLY,
            "rollout.rebalance.mode: dry-run: the automatic mode moves hosts between the prefill and decode",
        ),
    ],
)
def test_bad_sections_name_file_and_key(tmp_path: Path, rebalance: str, more: str, expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        _profile(tmp_path, rebalance, more)
    assert expected in str(err.value)
    assert "p.yml" in str(err.value)
