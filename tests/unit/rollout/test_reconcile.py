"""The controller's pure decisions around the machine: what a restart finds, when a version counts as
applied, when the controller may write, what the gateways' reports do to the state, and how one model
reads the policy version it shares with others (as_seen_by, lifted, peer_pending)."""

from __future__ import annotations

from pathlib import Path

from pdfleet.model.rollout import GateSpec
from pdfleet.model.stages import StageSpec
from pdfleet.rollout.gateways import GatewayReport
from pdfleet.rollout.machine import initial_state
from pdfleet.rollout.reconcile import (
    as_seen_by,
    blind_results,
    confirm,
    lifted,
    may_write,
    peer_pending,
    reconcile_reports,
    resuming,
)
from tests.unit.rollout.helpers import running, wait_until

HALF = StageSpec(short=0, long=50)
ZERO = StageSpec(short=0, long=0)
STEP = initial_state("colocated", ZERO, 4).model_copy(
    update={
        "phase": "progressing",
        "target": "long-prompts",
        "stage": "long-prompts@0",
        "weights": HALF,
        "version": 5,
    }
)


def _report(
    name: str, version: int, stage: str = "long-prompts@0", weights: StageSpec = HALF
) -> GatewayReport:
    return GatewayReport(name, version, stage, weights)


def test_a_restart_mid_step_names_the_gateways_already_written_and_those_behind() -> None:
    reports = [_report("gw0", 5), _report("gw1", 4, "colocated", ZERO)]
    (event,) = resuming(STEP.model_copy(update={"applied_version": 4}), reports, 1.0)
    assert (event["event"], event["version"]) == ("resuming", 5)
    assert (event["gateways_at_version"], event["gateways_behind"]) == (["gw0"], ["gw1"])
    assert resuming(STEP.model_copy(update={"applied_version": 5}), reports, 1.0) == []


def test_a_version_is_applied_only_once_every_gateway_reports_it() -> None:
    state = STEP.model_copy(update={"applied_version": 4})
    names = ["gw0", "gw1"]
    half = [_report("gw0", 5), _report("gw1", 4)]
    assert confirm(state, 5, names, ["gw0"], half, None, 1.0) == (state, [])
    new, (event,) = confirm(state, 5, names, ["gw1"], [_report("gw0", 5), _report("gw1", 5)], None, 1.0)
    assert new.applied_version == 5 and (event["event"], event["written"]) == ("applied", ["gw1"])
    halted, (event,) = confirm(state, 5, names, ["gw0"], [], "gateway gw1 is not answering", 1.0)
    assert halted.phase == "halted" and event["reason"] == "gateway gw1 is not answering"


def test_the_controller_never_writes_a_version_below_what_a_gateway_runs() -> None:
    assert may_write(STEP, [_report("gw0", 5), _report("gw1", 4)], None)
    assert not may_write(STEP, [_report("gw0", 6), _report("gw1", 4)], None)
    assert not may_write(STEP, [_report("gw0", 5)], "gateway gw1 is not answering")


def test_a_version_another_model_wrote_over_this_model_s_stage_is_this_model_s() -> None:
    """STEP is at version 5 (long-prompts@0); another model's state holds 7, so the controller wrote up
    to 7: a gateway at 7 with STEP's stage runs STEP's version; one at 7 with another stage for this
    model, or at 8 (no model wrote it), is foreign; one below is behind; with one model nothing moves."""
    reports = [_report("gw0", 7), _report("gw1", 7, "colocated", ZERO), _report("gw2", 8), _report("gw3", 4)]
    seen = as_seen_by(STEP, reports, written=7)
    assert [r.version for r in seen] == [5, 7, 8, 4]
    assert [r.version for r in as_seen_by(STEP, reports, written=5)] == [7, 7, 8, 4]  # one model: as before
    _, events, done = reconcile_reports(STEP, seen[:1], None, 1.0)
    assert not done and events == [] and may_write(STEP, seen[:1], None)
    halted, (event,), _ = reconcile_reports(STEP, seen[:2], None, 1.0)
    assert halted.phase == "halted" and "gateway gw1 runs version 7 (stage colocated)" in event["reason"]


def test_a_new_version_is_numbered_above_every_version_any_model_or_gateway_holds() -> None:
    def step(s):  # type: ignore[no-untyped-def]  # the machine's move: a new stage, version + 1
        new = s.model_copy(update={"stage": "long-prompts@1", "version": s.version + 1})
        return new, [{"event": "step", "version": new.version}]

    def hold(s):  # type: ignore[no-untyped-def]
        return s.model_copy(update={"reason": "waiting"}), [{"event": "measurement", "version": s.version}]

    new, events = lifted(STEP, 9, step)
    assert (new.version, events) == (10, [{"event": "step", "version": 10}])
    new, events = lifted(STEP, 9, hold)  # nothing new to write: the model's own version stays
    assert (new.version, new.reason, events) == (5, "waiting", [{"event": "measurement", "version": 5}])
    assert lifted(STEP, 3, step)[0].version == 6  # the floor below: as the machine numbers it


def test_a_lower_version_another_model_saved_is_written_first() -> None:
    pending = STEP.model_copy(update={"version": 4, "applied_version": 3})
    assert peer_pending(STEP, [pending])
    assert not peer_pending(STEP, [pending.model_copy(update={"applied_version": 4})])
    assert not peer_pending(STEP, [pending.model_copy(update={"version": 6, "applied_version": 3})])


def test_a_foreign_version_halts_once_an_abort_outranks_it_and_idle_adopts_it() -> None:
    foreign = [_report("gw0", 10, "long-prompts", StageSpec(short=0, long=100)), _report("gw1", 5)]
    halted, events, done = reconcile_reports(STEP, foreign, None, 1.0)
    assert (
        done and halted.phase == "halted" and "foreign policy: gateway gw0 runs version 10" in halted.reason
    )
    assert reconcile_reports(halted, foreign, None, 2.0) == (halted, [], True)
    aborting, _, done = reconcile_reports(halted.model_copy(update={"abort": True}), foreign, None, 3.0)
    assert not done and aborting.version == 10  # the rollback will be version 11
    idle = initial_state("colocated", ZERO, 4)
    both = [_report("gw0", 7, "long-prompts", HALF), _report("gw1", 7, "long-prompts", HALF)]
    adopted, (event,), done = reconcile_reports(idle, both, None, 4.0)
    assert done and (adopted.stable_stage, adopted.version, event["event"]) == ("long-prompts", 7, "adopted")
    resumed, (event,), done = reconcile_reports(
        STEP.model_copy(update={"phase": "halted"}), [_report("gw0", 5)], None, 5.0
    )
    assert not done and resumed.phase == "progressing" and event["event"] == "resumed"


def test_a_blind_tick_is_an_error_on_every_gate_of_every_class() -> None:
    gates = [
        GateSpec(name="a", metric="ttft", max_ratio=2.0),
        GateSpec(name="b", metric="error_rate", max=0.1),
    ]
    results = blind_results(gates, ["short", "long"], "no answer within 5 s")
    assert [(r.gate, r.length_class, r.outcome) for r in results] == [
        ("a", "short", "error"),
        ("b", "short", "error"),
        ("a", "long", "error"),
        ("b", "long", "error"),
    ]
    assert results[0].message == "a (short): metrics error: no answer within 5 s"


def test_an_abort_no_gateway_can_take_does_not_make_the_controller_spin(tmp_path: Path) -> None:
    """An abort wakes the controller at once, but one a tick already saw (a gateway down: nothing can be
    written) waits for the next tick instead of ticking back to back."""
    import socket
    import time

    from pdfleet.metrics.prometheus import PrometheusClient
    from pdfleet.rollout.config import ControllerConfig
    from pdfleet.rollout.controller import Controller
    from pdfleet.rollout.gateways import GatewayClient
    from pdfleet.rollout.store import Store

    with socket.socket() as s:  # a port nothing listens on: refused at once
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    config = ControllerConfig.model_validate(
        {
            "profile": "t",
            "rollout": {"interval_s": 0.5, "gates": [], "plans": {"long": {"steps": [{"pause": {}}]}}},
            "stages": {"colocated": ZERO.model_dump(), "long": {"short": 0, "long": 100}},
            "initial_stage": "colocated",
            "slo": {"ttft_p99_ms": 1.0, "tpot_p99_ms": 1.0, "itl_p99_ms": 1.0, "kv_transfer_p99_ms": 1.0},
            "gateways": [{"name": "gw0", "admin_url": closed}],
            "prometheus_url": closed,
            "stage_key_file": "unused",
            "state_dir": str(tmp_path),
        }
    )
    ticks: list[float] = []

    class Counting(Controller):
        def tick(self):  # type: ignore[no-untyped-def]
            ticks.append(time.monotonic())
            return super().tick()

    store = Store(tmp_path)
    store.save(STEP.model_copy(update={"phase": "halted", "target": "long", "abort": True}))
    controller = Counting(config, PrometheusClient(closed, timeout=1), GatewayClient("k", 1.0), store)
    with running(controller):
        # it keeps ticking: a second of ticks from the first, at least 3, within 30 s (a loaded machine may
        # take seconds to start the first tick)
        wait_until(
            lambda: len(ticks) >= 3 and time.monotonic() - ticks[0] > 1.0, 30, "3 ticks over a second", 0.05
        )
    # every 0.5 s, not back to back: 3 in the first second, and a tick started late by a starved process
    # can add only one per half second it lost; a spin ticks a millisecond apart (hundreds)
    in_first_second = sum(1 for t in ticks if t - ticks[0] <= 1.0)
    assert in_first_second <= 10, (in_first_second, [round(t - ticks[0], 3) for t in ticks[:12]])
