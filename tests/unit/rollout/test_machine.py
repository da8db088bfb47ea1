"""The rollout state machine, tick by tick from constructed inputs: submit, a step applied only once the
gateways report its version, pause and promote, analysis success, inconclusive, background and step
rollback, metrics errors, abort, promote --full, halted, and one rollout at a time."""

from __future__ import annotations

import pytest

from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.gates import GateResult
from pdfleet.rollout.machine import Tick, advance, gated_classes, initial_state, mismatch, on_mismatch, submit

STAGES = {"colocated": StageSpec(short=0, long=0), "long-prompts": StageSpec(short=0, long=100)}
SPEC = RolloutSpec.model_validate(
    {
        "min_samples": 10,
        "gates": [{"name": "ttft", "metric": "ttft", "max_ratio": 1.5}],
        "plans": {
            "long-prompts": {
                "steps": [
                    {"set_weight": {"short": 0, "long": 10}},
                    {"analysis": {"min_duration_s": 10, "min_samples": 20}},
                    {"pause": {}},
                    {"pause": {"duration_s": 5}},
                    {"set_weight": {"short": 0, "long": 100}},
                ]
            }
        },
    }
)
PLAN = SPEC.plans["long-prompts"]
PASS = [GateResult("ttft", "long", "pass", 1.0, 2.0, "ttft (long): 1 <= 2")]
FAIL = [GateResult("ttft", "long", "fail", 9.0, 2.0, "ttft (long): 9 > 2")]
ERROR = [GateResult("ttft", "long", "error", None, None, "ttft (long): metrics error: down")]


def _tick(state, now, results=(), samples=100):
    return advance(state, PLAN, SPEC, STAGES, Tick(now, results, samples))


def _applied(state):
    return state.model_copy(update={"applied_version": state.version})


def _started():
    state = submit(initial_state("colocated", STAGES["colocated"], 3), "long-prompts", STAGES, SPEC, 0.0)
    assert (state.phase, state.stable_stage, state.step_index) == ("progressing", "colocated", 0)
    return state


def _at_analysis():
    state, events = _tick(_started(), 1.0)
    assert (state.stage, state.weights.long, state.version) == ("long-prompts@0", 10, 4)
    assert events[0]["event"] == "set_weight"
    state, _ = _tick(state, 2.0)  # not applied yet: the step waits for every gateway
    assert state.step_index == 0
    state, events = _tick(_applied(state), 3.0)
    assert state.step_index == 1 and events[0]["event"] == "step"
    return state


def test_submit_refuses_a_second_rollout_an_unknown_plan_and_the_current_stage() -> None:
    with pytest.raises(ValueError, match="abort it first"):
        submit(_started(), "long-prompts", STAGES, SPEC, 1.0)
    idle = initial_state("colocated", STAGES["colocated"], 1)
    with pytest.raises(ValueError, match="no rollout plan for stage 'all-disagg'"):
        submit(idle, "all-disagg", STAGES, SPEC, 0.0)
    at_step = initial_state("long-prompts@2", StageSpec(short=0, long=50), 1)
    with pytest.raises(ValueError, match="not a stage of gateway.stages"):
        submit(at_step, "long-prompts", STAGES, SPEC, 0.0)
    at_target = initial_state("long-prompts", STAGES["long-prompts"], 1)
    with pytest.raises(ValueError, match="already at stage"):
        submit(at_target, "long-prompts", STAGES, SPEC, 0.0)


def test_a_whole_rollout_walks_every_step_to_the_target() -> None:
    state = _at_analysis()
    state, _ = _tick(state, 5.0, PASS)
    assert state.step_index == 1 and "to the step's minimum duration" in state.reason
    state, events = _tick(state, 14.0, PASS)
    assert state.step_index == 2 and events[0]["event"] == "measurement"
    state, _ = _tick(state, 15.0, PASS)
    assert state.phase == "paused" and "until rollout.promote" in state.reason
    state, _ = _tick(state, 500.0, PASS)
    assert state.phase == "paused" and state.step_index == 2
    state, _ = _tick(state.model_copy(update={"promote": True}), 501.0, PASS)
    assert (state.step_index, state.promote) == (3, False)
    state, _ = _tick(state, 503.0, PASS)
    assert state.phase == "paused" and "s left" in state.reason
    state, _ = _tick(state, 506.5, PASS)
    assert state.step_index == 4
    state, _ = _tick(state, 507.0)
    assert state.weights.long == 100 and state.step_index == 4
    state, _ = _tick(_applied(state), 508.0)
    state, events = _tick(state, 509.0)
    assert (state.phase, state.stage, state.stable_stage) == ("succeeded", "long-prompts", "long-prompts")
    assert events[-1]["event"] == "succeeded" and state.version == 6
    assert _tick(state, 510.0) == (state, [])


def test_a_failed_gate_in_analysis_rolls_back_to_the_stable_stage() -> None:
    state, events = _tick(_at_analysis(), 4.0, FAIL)
    assert (state.phase, state.stage, state.weights.long) == ("degraded", "colocated", 0)
    assert "ttft (long): 9 > 2" in state.reason and state.version == 5
    assert [e["event"] for e in events] == ["measurement", "degraded"]
    assert state.last_results[0]["value"] == 9.0


def test_a_failed_gate_during_a_pause_rolls_back_too() -> None:
    state, _ = _tick(_at_analysis(), 14.0, PASS)
    state, _ = _tick(state, 15.0, PASS)
    assert state.phase == "paused"
    state, _ = _tick(state, 16.0, FAIL, samples=5)  # not measurable yet: too few samples
    assert state.phase == "paused"
    state, _ = _tick(state, 17.0, FAIL)
    assert state.phase == "degraded" and state.stage == "colocated"


def test_metrics_errors_past_the_limit_roll_back() -> None:
    state = _at_analysis()
    for now in range(4, 8):
        state, _ = _tick(state, float(now), ERROR)
        assert state.phase == "progressing"
    assert state.consecutive_errors == 4
    state, _ = _tick(state, 8.0, ERROR)
    assert state.phase == "degraded" and "5 metrics errors in a row" in state.reason


def test_too_little_traffic_pauses_inconclusive_until_promoted() -> None:
    state = _at_analysis()
    state, _ = _tick(state, 30.0, PASS, samples=3)
    assert state.phase == "progressing" and "3 of 20 samples" in state.reason
    state, events = _tick(state, 44.0, PASS, samples=3)
    assert state.phase == "inconclusive" and "too little traffic" in state.reason
    assert events[-1]["event"] == "inconclusive"
    state, _ = _tick(state, 60.0, PASS, samples=3)
    assert state.phase == "inconclusive"
    state, _ = _tick(state.model_copy(update={"promote": True}), 61.0, PASS)
    assert (state.phase, state.step_index) == ("progressing", 2)


def test_abort_goes_back_to_the_stable_stage_now() -> None:
    state = _at_analysis().model_copy(update={"abort": True})
    state, events = _tick(state, 4.0, PASS)
    assert (state.phase, state.stage, state.abort) == ("aborted", "colocated", False)
    assert events[0]["reason"] == "aborted by the operator (rollout.abort)"
    again = submit(state, "long-prompts", STAGES, SPEC, 10.0)
    assert again.stable_stage == "colocated" and again.phase == "progressing"


def test_promote_full_skips_the_remaining_steps() -> None:
    state = _at_analysis().model_copy(update={"promote_full": True})
    state, events = _tick(state, 4.0)
    assert (state.phase, state.stage, state.weights.long) == ("succeeded", "long-prompts", 100)
    assert [e["event"] for e in events] == ["promote_full", "succeeded"]


def test_a_halted_rollout_records_but_does_not_move() -> None:
    state = _at_analysis().model_copy(update={"phase": "halted"})
    new, events = _tick(state, 50.0, FAIL)
    assert new.phase == "halted" and new.step_index == 1 and events[0]["event"] == "measurement"


def test_gated_classes_are_the_ones_moved() -> None:
    assert gated_classes(StageSpec(short=0, long=10), STAGES["colocated"]) == ["long"]
    assert gated_classes(StageSpec(short=10, long=100), STAGES["long-prompts"]) == ["short"]


def test_failure_limit_counts_per_step_each_step_starts_again_at_zero() -> None:
    """Documented in docs/rollout.md: `failure_limit` is per step (Argo: per analysis run)."""
    spec = SPEC.model_copy(update={"failure_limit": 1})
    state = _at_analysis()
    state, _ = advance(state, PLAN, spec, STAGES, Tick(4.0, FAIL, 100))
    assert (state.phase, state.failed_checks) == ("progressing", 1)
    state, _ = advance(state, PLAN, spec, STAGES, Tick(14.0, PASS, 100))
    assert (state.step_index, state.failed_checks) == (2, 0)  # the analysis passed: the count restarts
    state, _ = advance(state, PLAN, spec, STAGES, Tick(15.0, FAIL, 100))
    assert (state.phase, state.failed_checks) == ("paused", 1)  # one failure in this step: allowed
    state, _ = advance(state, PLAN, spec, STAGES, Tick(16.0, FAIL, 100))
    assert state.phase == "degraded"


def test_no_step_moves_on_while_the_gates_cannot_be_read() -> None:
    state, _ = _tick(_at_analysis(), 14.0, PASS)
    state, _ = _tick(state, 15.0, PASS)
    state = state.model_copy(update={"promote": True})
    for now in (16.0, 17.0, 18.0):
        state, _ = _tick(state, now, ERROR)
        assert (state.step_index, state.phase) == (2, "paused") and "holding step 2" in state.reason
    state, _ = _tick(state, 19.0, PASS)
    assert state.step_index == 3  # readable again: the promote is taken


def test_a_rollout_the_profile_no_longer_describes_halts_in_one_line_and_aborts_to_a_stage_that_exists() -> (
    None
):
    state = _at_analysis()
    renamed = SPEC.model_copy(update={"plans": {"all-long": PLAN}})
    why = mismatch(state, renamed, STAGES)
    assert why == "the profile has no rollout plan 'long-prompts' any more (plans: all-long)"
    halted, events = on_mismatch(state, STAGES, why, 5.0, "colocated")
    assert halted.phase == "halted" and "\n" not in halted.reason
    assert halted.reason.endswith("rollout.abort goes back to stage colocated")
    assert on_mismatch(halted, STAGES, why, 6.0, "colocated") == (halted, [])  # said once
    aborted, events = on_mismatch(halted.model_copy(update={"abort": True}), STAGES, why, 7.0, "colocated")
    assert (aborted.phase, aborted.stage, aborted.weights.long) == ("aborted", "colocated", 0)
    assert aborted.version == state.version + 1
    # the stable stage renamed: an abort goes to the controller's initial stage
    stages = {"baseline": StageSpec(short=0, long=0), "long-prompts": STAGES["long-prompts"]}
    assert (
        mismatch(state, SPEC, stages)
        == "the stable stage 'colocated' is no longer in the profile's gateway.stages"
    )
    home, _ = _tick(state.model_copy(update={"abort": True}), 8.0)
    assert home.stage == "colocated"
    gone, _ = advance(state.model_copy(update={"abort": True}), PLAN, SPEC, stages, Tick(8.0), "baseline")
    assert (gone.phase, gone.stage, gone.stable_stage) == ("aborted", "baseline", "baseline")
    assert mismatch(initial_state("gone", StageSpec(short=0, long=0), 1), renamed, stages) is None  # idle
