"""A rollout plan's shadow step (issue 33): which run the state wants (only while the step progresses),
which gateway is sent which start or stop, and against a real fleet on loopback (simulators, two real
gateways, a real Prometheus): the step shadows with no user moved and stops shadowing when it ends,
and an abort while a dead controller left a shadow running is acted on by the next controller."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.model.rollout import RolloutSpec
from pdfleet.model.stages import StageSpec
from pdfleet.rollout import commands
from pdfleet.rollout.config import GatewayTarget
from pdfleet.rollout.controller import Controller
from pdfleet.rollout.machine import ShadowWant, initial_state, submit, with_shadow
from pdfleet.rollout.shadow_step import none_of_ours, shadow_writes, tag_of
from tests.unit.rollout.helpers import MODEL, Fleet, Load, fleet, running, wait_until

STAGES = {"colocated": StageSpec(short=0, long=0), "long-prompts": StageSpec(short=0, long=100)}
GATES = [
    {"name": "error-rate", "metric": "error_rate", "max": 0.01},
    {"name": "ttft-vs-colocated", "metric": "ttft", "max_ratio": 20.0, "max": "slo"},
    {"name": "fallback-rate", "metric": "fallback_rate", "max": 0.05},  # not a shadow's: left out
]
SIM_ARGS = [MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.02"]


def _spec(shadow: dict[str, Any]) -> dict[str, Any]:
    return {
        "interval_s": 0.5,
        "window_s": 8,
        "min_samples": 3,
        "gates": GATES,
        "plans": {"long-prompts": {"steps": [{"shadow": shadow}, {"set_weight": {"short": 0, "long": 100}}]}},
    }


SPEC = RolloutSpec.model_validate(_spec({"share": 20, "min_duration_s": 10, "min_samples": 5}))
WANT = ShadowWant(key="long-prompts:0.000:0", stage="long-prompts", classes=["long"], share=20, until=100.0)


def _on_step() -> Any:
    state = submit(initial_state("colocated", STAGES["colocated"], 3), "long-prompts", STAGES, SPEC, 0.0)
    return with_shadow(state, SPEC, STAGES, 1.0)


def test_the_shadow_is_wanted_only_while_its_step_progresses() -> None:
    state, events = _on_step()
    assert state.shadow == ShadowWant(
        key="long-prompts:0.000:0", stage="long-prompts", classes=["long"], share=20, until=40.5
    )
    assert state.shadow_live and [e["event"] for e in events] == ["shadow_on"]
    assert with_shadow(state, SPEC, STAGES, 2.0) == (state, [])  # unchanged: nothing to say
    for update in ({"phase": "inconclusive"}, {"phase": "halted"}, {"abort": True}, {"step_index": 1}):
        off, events = with_shadow(state.model_copy(update=update), SPEC, STAGES, 3.0)
        assert off.shadow is None and off.shadow_live, update  # live until the gateways confirm it
        assert [e["event"] for e in events] == ["shadow_off"]


def _doc(tag: str | None) -> dict[str, Any]:
    return {"running": None if tag is None else {"tag": tag}, "last": None, "in_flight": 0}


def test_starts_go_where_the_run_is_missing_and_stops_only_to_our_own() -> None:
    mine = tag_of("llama", WANT)
    docs = {
        "gw0": _doc(None),
        "gw1": _doc(mine),
        "gw2": _doc(None) | {"running": {"tag": None}},  # the operator's own run: replaced
        "gw3": _doc("pdfleet-rollout/small/long-prompts:1.000:2"),  # another model's step: waited for
    }
    writes = shadow_writes(WANT, "llama", "llama", docs, 40.0)
    assert [name for name, _ in writes] == ["gw0", "gw2"]
    body = writes[0][1]
    assert body == {
        "action": "start",
        "stage": "long-prompts",
        "share": 20,
        "classes": ["long"],
        "minutes": 1.0,
        "tag": mine,
        "model": "llama",
    }
    assert shadow_writes(WANT, "llama", None, docs, 100.0) == [("gw1", {"action": "stop", "tag": mine})]
    assert shadow_writes(None, "llama", None, docs, 40.0) == [("gw1", {"action": "stop", "tag": mine})]
    assert not none_of_ours("llama", docs) and none_of_ours("small", {"gw1": docs["gw1"]})


# ---- against a real fleet -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def colocated() -> Iterator[SimProcess]:
    with SimProcess(SIM_ARGS) as sim:
        yield sim


def _runs(f: Fleet, controller: Controller) -> list[dict[str, Any] | None]:
    """Every gateway's running shadow run (None: none)."""
    targets = [GatewayTarget(name=f"gw{i}", admin_url=g.url) for i, g in enumerate(f.gateways)]
    return [controller.gateways.shadow(t)["running"] for t in targets]


def _phase(controller: Controller, *phases: str) -> Any:
    state = controller.store.load()
    return state if state is not None and state.phase in phases else None


@pytest.mark.procs
def test_a_shadow_step_shadows_moves_nobody_and_stops_when_it_ends(
    tmp_path: Path, colocated: SimProcess
) -> None:
    with SimProcess(SIM_ARGS) as disagg, fleet(tmp_path, colocated.url, disagg.url) as f:
        controller = f.controller(
            _spec({"share": 50, "classes": ["long"], "min_duration_s": 4, "min_samples": 3})
        )
        load = Load([g.port for g in f.gateways], threads=2, pace_s=0.1).start()  # ~15 requests/s, paced
        try:
            with running(controller):
                wait_until(lambda: controller.store.load(), 30, "the controller's first state")
                commands.submit_rollout(controller, "long-prompts")
                runs = wait_until(
                    lambda: all(_runs(f, controller)) and _runs(f, controller), 10, "the shadow runs"
                )
                # shadowing, and nobody moved: every gateway still runs the stable stage
                assert {(r.stage, r.weights.long) for r in f.reports(controller)} == {("colocated", 0)}
                assert {(r["share"], tuple(r["classes"]), r["tag"]) for r in runs} == {
                    (50, ("long",), runs[0]["tag"])
                } and runs[0]["tag"].startswith("pdfleet-rollout/-/long-prompts:")
                state = wait_until(
                    lambda: _phase(controller, "succeeded", "degraded", "inconclusive"), 60, "the end"
                )
                wait_until(lambda: not controller.store.load().shadow_live, 30, "the shadow confirmed off")
        finally:
            load.stop()
        assert state.phase == "succeeded", state.reason
        assert _runs(f, controller) == [None, None]
        kinds = [e["event"] for e in controller.store.history()]
        assert kinds.index("shadow_on") < kinds.index("shadow_write") < kinds.index("shadow_off")
        assert kinds.index("shadow_off") < kinds.index("set_weight") and "shadow_stopped" in kinds
        history = controller.store.history()
        step = [e for e in history if e["event"] == "step"][0]
        assert step["reason"] == "shadow of step 0: every gate passed"
        # the measurement that ended the step: the shadows' own figures against their primaries'
        last = [e for e in history[: history.index(step)] if e["event"] == "measurement"][-1]
        assert last["samples"] >= 3
        assert {(r["gate"], r["length_class"], r["outcome"]) for r in last["results"]} == {
            ("error-rate", "long", "pass"),
            ("ttft-vs-colocated", "long", "pass"),
        }
        assert all(r["value"] is not None for r in last["results"])
        assert load.failed == 0, load.errors[:3]


@pytest.mark.procs
def test_an_abort_after_the_controller_died_mid_shadow_stops_it(
    tmp_path: Path, colocated: SimProcess
) -> None:
    with SimProcess(SIM_ARGS) as disagg, fleet(tmp_path, colocated.url, disagg.url) as f:
        rollout = _spec({"share": 20, "min_duration_s": 300, "min_samples": 3})
        first = f.controller(rollout)
        with running(first):
            wait_until(lambda: first.store.load(), 30, "the controller's first state")
            commands.submit_rollout(first, "long-prompts")
            wait_until(lambda: all(_runs(f, first)), 30, "the shadow runs")
        # the controller is gone, its shadow runs go on (until the step's deadline, minutes away)
        assert all(r is not None and r["seconds_left"] > 60 for r in _runs(f, first))
        commands.flag(first, "abort")
        second = f.controller(rollout)
        with running(second):
            state = wait_until(lambda: _phase(second, "aborted"), 30, "the abort")
            wait_until(lambda: not second.store.load().shadow_live, 30, "the shadow confirmed off")
        assert _runs(f, second) == [None, None] and state.shadow is None
        assert "shadow_stopped" in [e["event"] for e in second.store.history()]
