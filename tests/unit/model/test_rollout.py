"""The `rollout:` section: the shipped plans validate, and each kind of bad plan or gate is refused with
the file and key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.model.profile_loader import load_profile
from pdfleet.model.rollout import Analysis, Pause, RolloutSpec, SetWeight, Shadow, shadow_gates, weights_of
from pdfleet.model.stages import StageSpec
from tests.unit.model.helpers import GOOD, PROFILES


def _profile(tmp_path: Path, rollout: str):
    (tmp_path / "_good.yml").write_text(GOOD)
    path = tmp_path / "p.yml"
    path.write_text("extends: _good\nrollout:\n" + rollout)
    return load_profile(str(path), tmp_path)


def test_shipped_profiles_have_a_plan_per_target_stage() -> None:
    for name in ("cross-rdma", "same-host-pcie", "lab-cross", "lab-same-host"):
        profile = load_profile(name, PROFILES)
        plans = profile.rollout.plans
        assert set(plans) == {"canary-long", "long-prompts", "all-disagg"}
        steps = plans["long-prompts"].steps
        ramp = [w.long for s in steps if (w := weights_of(s)) is not None]
        assert ramp == ([10, 50, 100] if name == "lab-cross" else [10, 25, 50, 100])  # the lab's: shorter
        assert isinstance(steps[1], Analysis) and isinstance(plans["all-disagg"].steps[2], Pause)
        assert {g.name for g in profile.rollout.gates} >= {"ttft-p99-vs-colocated", "kv-transfer-p99-slo"}
    lab = load_profile("lab-cross", PROFILES).rollout
    first = lab.plans["long-prompts"].steps[1]  # lab-sized: 20 s steps over a 20 s window
    assert isinstance(first, Analysis) and (first.analysis.min_duration_s, lab.window_s) == (20, 20)
    assert isinstance(lab.plans["canary-long"].steps[2], Pause)  # the promote lab test's pause


def test_a_good_plan_parses_into_typed_steps(tmp_path: Path) -> None:
    profile = _profile(
        tmp_path,
        """
  interval_s: 0.5
  gates: [{name: ttft, metric: ttft, max_ratio: 1.2, max: slo}]
  plans:
    long-prompts:
      steps:
        - set_weight: {short: 0, long: 50}
        - pause: {duration_s: 5}
        - pause: {}
        - analysis: {}
        - set_weight: {short: 0, long: 100}
""",
    )
    steps = profile.rollout.plans["long-prompts"].steps
    assert isinstance(steps[0], SetWeight) and steps[0].set_weight == StageSpec(short=0, long=50)
    assert isinstance(steps[1], Pause) and steps[1].pause.duration_s == 5
    assert isinstance(steps[2], Pause) and steps[2].pause.duration_s is None
    assert isinstance(steps[3], Analysis) and steps[3].analysis.min_samples == 50
    assert profile.rollout.interval_s == 0.5 and profile.rollout.gates[0].quantile == 0.99


def _shadow(step: str) -> str:
    """A rollout section whose plan starts with the shadow step `step`."""
    return (
        "  gates: [{name: ttft, metric: ttft, max_ratio: 1.5}, {name: fb, metric: fallback_rate, max: 0.1}]\n"
        "  plans: {long-prompts: {steps: [{shadow: " + step + "}, {set_weight: {short: 0, long: 100}}]}}\n"
    )


def test_a_shadow_step_parses_and_holds_the_gates_a_shadow_can_measure(tmp_path: Path) -> None:
    profile = _profile(tmp_path, _shadow("{share: 20, min_duration_s: 30}"))
    step = profile.rollout.plans["long-prompts"].steps[0]
    assert isinstance(step, Shadow) and (step.shadow.share, step.shadow.classes) == (20, None)
    assert [g.name for g in shadow_gates(step.shadow, profile.rollout.gates)] == ["ttft"]  # not fb
    # what roles/rollout renders into controller.json reads back as the same plan
    assert RolloutSpec.model_validate(profile.rollout.model_dump(mode="json")) == profile.rollout


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        (
            "  plans: {long-prompts: {steps: [{set_weight: {short: 0, long: 100}, pause: {}}]}}\n",
            "rollout.plans.long-prompts.steps[0]",
        ),
        (
            "  plans: {long-prompts: {steps: [{set_weight: {short: 0, long: 101}}]}}\n",
            "rollout.plans.long-prompts.steps[0]",
        ),
        ("  plans: {long-prompts: {steps: []}}\n", "rollout.plans.long-prompts.steps"),
        (
            "  plans: {nowhere: {steps: [{set_weight: {short: 0, long: 100}}]}}\n",
            "rollout.plans.nowhere: 'nowhere' is not a stage in gateway.stages",
        ),
        ("  plans: {long-prompts: {steps: [{pause: {}}]}}\n", "has no set_weight step"),
        (
            "  plans: {long-prompts: {steps: [{set_weight: {short: 0, long: 50}}, "
            "{set_weight: {short: 0, long: 20}}, {set_weight: {short: 0, long: 100}}]}}\n",
            "rollout.plans.long-prompts.steps[1].set_weight.long: lowers long from 50 to 20",
        ),
        (
            "  plans: {long-prompts: {steps: [{set_weight: {short: 0, long: 50}}]}}\n",
            "rollout.plans.long-prompts.steps[0].set_weight: the last weights",
        ),
        ("  gates: [{name: a, metric: ttft}]\n", "set max_ratio (vs colocated), max, or both"),
        ("  gates: [{name: a, metric: error_rate, max: slo}]\n", "max: slo needs one of"),
        (
            "  gates: [{name: a, metric: kv_transfer, max_ratio: 2}]\n",
            "the colocated pool has no KV transfer",
        ),
        (
            "  gates: [{name: a, metric: ttft, max: 1}, {name: a, metric: itl, max: 1}]\n",
            "rollout.gates[1].name: 'a' is used by another gate",
        ),
        ("  gates: [{name: a, metric: latency, max: 1}]\n", "rollout.gates[0].metric"),
        ("  failure_limit: -2\n", "rollout.failure_limit"),
        (_shadow("{share: 0}"), "rollout.plans.long-prompts.steps[0].Shadow.shadow.share: must be >= 1"),
        (_shadow("{share: 101}"), "rollout.plans.long-prompts.steps[0].Shadow.shadow.share: must be <= 100"),
        (
            _shadow("{share: 20, classes: [medium]}"),
            "steps[0].Shadow.shadow.classes[0]: must be one of 'short' or 'long' (got 'medium')",
        ),
        (
            _shadow("{share: 20, classes: [short]}"),
            "rollout.plans.long-prompts.steps[0].shadow.classes[0]: 'short': stage long-prompts moves 0%",
        ),
        (
            _shadow("{share: 20, gates: [nope]}"),
            "rollout.plans.long-prompts.steps[0].shadow.gates[0]: 'nope' is not a gate of rollout.gates",
        ),
        (
            _shadow("{share: 20, gates: [fb]}"),
            "steps[0].shadow.gates[0]: 'fb' measures fallback_rate, which a shadow never has",
        ),
        (_shadow("{}"), "rollout.plans.long-prompts.steps[0].Shadow.shadow.share: required key is missing"),
        ("  plans: {long-prompts: {steps: [{hold: {}}]}}\n", "steps[0]: a step is one of set_weight, pause"),
        ("  colour: blue\n", "rollout.colour: unknown key"),
    ],
)
def test_bad_rollout_sections_name_file_and_key(tmp_path: Path, rollout: str, expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        _profile(tmp_path, rollout)
    assert expected in str(err.value)
    assert "p.yml" in str(err.value)
