"""The controller against a real fleet on loopback: simulators as the pools, two real gateways, a real
Prometheus. A rollout walks every step to 100% of long prompts with no failed request, every gateway
reporting each new version; a fault (the disaggregated pool stopped) makes the fallback gate fail and
the controller roll back by itself, within seconds; an unreachable gateway halts the rollout."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.bench.launch import SimProcess
from pdfleet.gateway.decider import REASONS
from pdfleet.metrics.prometheus import PrometheusClient
from pdfleet.rollout import commands
from pdfleet.rollout.controller import Controller
from tests.unit.rollout.helpers import MODEL, Load, fleet, hung_server, running, wait_until

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

SIM_ARGS = [MODEL, "--served-model-name", "llama", "--sim-time-scale", "0.02"]
GATES = [
    {"name": "fallback-rate", "metric": "fallback_rate", "max": 0.05},
    {"name": "error-rate", "metric": "error_rate", "max": 0.01},
    {"name": "ttft-vs-colocated", "metric": "ttft", "max_ratio": 20.0, "max": "slo"},
]


def _load(f: object) -> Load:
    """Load through the fleet's gateways at a few requests a second per thread: the gates need
    min_samples in their window, not a saturated simulator (a closed loop burned the CPU)."""
    return Load([g.port for g in f.gateways], threads=2, pace_s=0.1).start()  # type: ignore[attr-defined]


def _rollout(steps: list[dict[str, object]]) -> dict[str, object]:
    return {
        "interval_s": 0.5,
        "window_s": 8,
        "min_samples": 3,
        "gates": GATES,
        "plans": {"long-prompts": {"steps": steps}},
    }


@pytest.fixture(scope="module")
def colocated() -> Iterator[SimProcess]:
    with SimProcess(SIM_ARGS) as sim:
        yield sim


def _phase(controller: Controller, *phases: str) -> object:
    state = controller.store.load()
    return state if state is not None and state.phase in phases else None


def _fallbacks(prometheus: str) -> float:
    """Every fallback Prometheus holds (a counter that never moved is absent: 0)."""
    got = PrometheusClient(prometheus, timeout=2.0).instant("sum(pdfleet_gateway_fallbacks_total)")
    return sum(s.value for s in got)


def _events(controller: Controller, kind: str) -> list[dict[str, object]]:
    return [e for e in controller.store.history() if e["event"] == kind]


def test_a_rollout_walks_every_step_and_every_gateway_reports_each_version(
    tmp_path: Path,
    colocated: SimProcess,
) -> None:
    steps = [
        {"set_weight": {"short": 0, "long": 50}},
        {"analysis": {"min_duration_s": 3, "min_samples": 3}},
        {"set_weight": {"short": 0, "long": 100}},
        {"analysis": {"min_duration_s": 3, "min_samples": 3}},
    ]
    with SimProcess(SIM_ARGS) as disagg, fleet(tmp_path, colocated.url, disagg.url) as f:
        controller = f.controller(_rollout(steps))
        load = _load(f)
        try:
            with running(controller):
                wait_until(lambda: controller.store.load(), 30, "the controller's first state")
                commands.submit_rollout(controller, "long-prompts")
                state = wait_until(
                    lambda: _phase(controller, "succeeded", "degraded", "inconclusive"),
                    90,
                    "the rollout to end",
                )
        finally:
            load.stop()
        assert state.phase == "succeeded", state.reason
        assert (state.stage, state.stable_stage, state.weights.long) == ("long-prompts", "long-prompts", 100)
        applied = _events(controller, "applied")
        assert [e["weights"]["long"] for e in applied] == [50, 100, 100]
        assert all(e["gateways"] == ["gw0", "gw1"] for e in applied)
        assert len(_events(controller, "measurement")) >= 4
        reports = f.reports(controller)
        assert {(r.version, r.stage) for r in reports} == {(state.version, "long-prompts")}
        assert load.failed == 0 and load.sent > 20, load.errors[:3]
        status = commands.status(controller)
        assert status["phase"] == "succeeded" and status["time_to_next_step_s"] is None
        mix = status["reason_mix"]  # the gateways' decisions over the gates' window, from Prometheus
        assert isinstance(mix, dict) and mix.get("stage_weight", 0) > 0, mix
        assert set(mix) <= set(REASONS), mix


def test_a_fault_mid_rollout_rolls_back_by_itself(tmp_path: Path, colocated: SimProcess) -> None:
    steps = [
        {"set_weight": {"short": 0, "long": 50}},
        {"pause": {}},
        {"set_weight": {"short": 0, "long": 100}},
    ]
    disagg = SimProcess(SIM_ARGS).__enter__()
    try:
        with fleet(tmp_path, colocated.url, disagg.url) as f:
            controller = f.controller(_rollout(steps))
            load = _load(f)
            try:
                with running(controller):
                    wait_until(lambda: controller.store.load(), 30, "the controller's first state")
                    commands.submit_rollout(controller, "long-prompts")
                    wait_until(lambda: _phase(controller, "paused"), 30, "the pause at 50%")
                    time.sleep(2)  # a clean window first: the gates pass at 50%
                    assert _phase(controller, "paused")
                    disagg.stop()  # the fault: the disaggregated pool goes away
                    # measured at the gateways, from the first scrape holding a fallback (the breach is
                    # measurable) to every gateway serving the stable stage: a controller that decides
                    # but does not push fails here
                    wait_until(lambda: _fallbacks(f.prom.url) > 0, 30, "a fallback in Prometheus", every=0.05)
                    measurable = time.monotonic()
                    wait_until(
                        lambda: {r.stage for r in f.reports(controller)} == {"colocated"},
                        30,  # the claim is `took` below; a longer wait only reports a miss with its figure
                        "every gateway on colocated",
                        every=0.05,
                    )
                    took = time.monotonic() - measurable
                    state = wait_until(lambda: _phase(controller, "degraded"), 30, "the rollback")
            finally:
                load.stop()
            assert took <= 5.0, f"the gateways served colocated {took:.1f} s after the breach was measurable"
            assert "fallback-rate" in state.reason and (state.stage, state.weights.long) == ("colocated", 0)
            fallback = [r for r in state.last_results if r["gate"] == "fallback-rate"][0]
            assert fallback["outcome"] == "fail" and fallback["value"] > 0.05
            assert {(r.version, r.stage) for r in f.reports(controller)} == {(state.version, "colocated")}
            assert load.failed == 0, load.errors[:3]  # fallbacks are counted, not failed
    finally:
        disagg.stop()


def test_an_unreachable_gateway_halts_the_rollout(tmp_path: Path, colocated: SimProcess) -> None:
    steps = [{"pause": {}}, {"set_weight": {"short": 0, "long": 100}}]
    with fleet(tmp_path, colocated.url, colocated.url) as f:
        controller = f.controller(_rollout(steps))
        with running(controller):
            wait_until(lambda: controller.store.load(), 30, "the controller's first state")
            commands.submit_rollout(controller, "long-prompts")
            wait_until(lambda: _phase(controller, "paused"), 30, "the pause")
            f.gateways[1].stop()
            commands.flag(controller, "promote")
            state = wait_until(lambda: _phase(controller, "halted"), 30, "the halt")
            assert "gw1" in state.reason and state.weights.long == 0
            gw0 = controller.gateways.report(controller.config.gateways[0])
            assert (gw0.stage, gw0.version) == ("colocated", 1)  # no split brain: nothing was applied
            (halt,) = _events(controller, "halted")
            assert "gw1" in str(halt["reason"]) and "not answering" in str(halt["reason"])


def test_dry_run_measures_and_changes_nothing_then_abort_goes_back(
    tmp_path: Path, colocated: SimProcess
) -> None:
    steps = [
        {"set_weight": {"short": 0, "long": 50}},
        {"pause": {}},
        {"set_weight": {"short": 0, "long": 100}},
    ]
    with SimProcess(SIM_ARGS) as disagg, fleet(tmp_path, colocated.url, disagg.url) as f:
        controller = f.controller(_rollout(steps))
        load = _load(f)
        try:
            with running(controller):
                wait_until(lambda: controller.store.load(), 30, "the controller's first state")
                commands.submit_rollout(controller, "long-prompts")
                wait_until(lambda: _phase(controller, "paused"), 30, "the pause at 50%")
                wait_until(
                    lambda: [e for e in _events(controller, "measurement") if e["samples"]],
                    30,
                    "requests on the disaggregated pool in the window",
                )
            # the controller stopped: nothing but the dry run could write now
            state_file = (f.state_dir / "state.json").read_bytes()
            if True:  # the dry run, with no controller ticking
                versions = [r.version for r in f.reports(controller)]
                dry = commands.evaluate(controller, "long-prompts")
                assert (f.state_dir / "state.json").read_bytes() == state_file
                assert [r.version for r in f.reports(controller)] == versions
                by_gate = {r["gate"]: r for r in dry["results"]}
                assert dry["dry_run"] and set(by_gate) == {g["name"] for g in GATES}, dry
                assert dry["samples"] > 0, dry["results"]
                ttft = by_gate["ttft-vs-colocated"]
                assert ttft["outcome"] == "pass" and ttft["value"] > 0 and ttft["threshold"] > 0
            with running(controller):
                commands.flag(controller, "abort")
                state = wait_until(lambda: _phase(controller, "aborted"), 30, "the abort")
        finally:
            load.stop()
        assert (state.stage, state.weights.long) == ("colocated", 0)
        assert {(r.version, r.stage) for r in f.reports(controller)} == {(state.version, "colocated")}
        assert _events(controller, "abort") and _events(controller, "aborted")
        assert load.failed == 0, load.errors[:3]
        with pytest.raises(Exception, match="no rollout is active"):
            commands.flag(controller, "promote")


def test_a_foreign_policy_halts_the_rollout_and_abort_outranks_it(
    tmp_path: Path, colocated: SimProcess
) -> None:
    steps = [{"pause": {}}, {"set_weight": {"short": 0, "long": 100}}]
    with fleet(tmp_path, colocated.url, colocated.url) as f:
        controller = f.controller(_rollout(steps))
        with running(controller):
            wait_until(lambda: controller.store.load(), 30, "the controller's first state")
            commands.submit_rollout(controller, "long-prompts")
            wait_until(lambda: _phase(controller, "paused"), 30, "the pause")
            # what `invoke provision --stage long-prompts` does to one gateway behind the controller's back
            target = controller.config.gateways[0]
            controller.gateways.apply(target, 10, "long-prompts", controller.config.stages)
            state = wait_until(lambda: _phase(controller, "halted"), 30, "the halt")
            assert "foreign policy: gateway gw0 runs version 10" in state.reason
            commands.flag(controller, "abort")
            state = wait_until(lambda: _phase(controller, "aborted"), 30, "the abort")
        assert state.version == 11 and state.stage == "colocated"
        assert {(r.version, r.stage) for r in f.reports(controller)} == {(11, "colocated")}


# ---- the way back: crash safety, a hung metrics source, a profile changed under a rollout ---------

# The controller in a process of its own, built from its configuration file as `pdfleet-rollout run`
# builds it, that SIGKILLs itself at one point of a step's apply sequence (fault injection: the
# gateways, the HTTP and the state directory are all real).
KILLED_AT = r"""
import os, signal, sys, threading
from pathlib import Path
from pdfleet.rollout.cli import controllers_from

controllers = controllers_from(Path(sys.argv[1]))
controller = controllers.models[int(sys.argv[3]) if len(sys.argv) > 3 else 0]  # the model killed
where, _, name = sys.argv[2].partition(":")
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
apply, save = controller.gateways.apply, controller.store.save

def failing_apply(target, *args):
    if where == "before-write" and target.name == name:
        die()
    apply(target, *args)
    if where == "after-write" and target.name == name:
        die()

def failing_save(state):
    old = controller.store.load()
    confirming = old is not None and state.applied_version > old.applied_version and state.version > 1
    if where == "before-confirm" and confirming:
        die()
    save(state)
    if where == "after-confirm" and confirming:
        die()

controller.gateways.apply, controller.store.save = failing_apply, failing_save
controllers.run(threading.Event())
"""
KILL_POINTS = [
    "before-write:gw0",  # the intent saved, no gateway written
    "after-write:gw0",  # gw0 took the step, the controller died before recording it
    "before-write:gw1",  # gw0 written and recorded, gw1 not yet
    "after-write:gw1",  # both took it, nothing confirmed
    "before-confirm",
    "after-confirm",
]


def _converged(controller: Controller, f: object) -> object:
    state = controller.store.load()
    reports = f.reports(controller)  # type: ignore[attr-defined]
    versions = {r.version for r in reports}
    if state is None or versions != {state.version} or state.applied_version != state.version:
        return None
    return state, reports


def test_a_controller_killed_at_any_point_of_a_step_resumes_and_the_fleet_converges(
    tmp_path: Path, colocated: SimProcess
) -> None:
    import json
    import subprocess
    import sys

    steps = [
        {"set_weight": {"short": 0, "long": 50}},
        {"pause": {}},
        {"set_weight": {"short": 0, "long": 100}},
    ]
    with fleet(tmp_path, colocated.url, colocated.url) as f:
        rollout = {**_rollout(steps), "interval_s": 0.2}
        config = tmp_path / "controller.json"
        config.write_text(json.dumps(f.file([{"name": "llama", "rollout": rollout}])))
        controller = f.controller(rollout, name="llama")
        with running(controller):
            wait_until(lambda: controller.store.load(), 30, "the controller's first state")
        for point in KILL_POINTS:
            commands.submit_rollout(controller, "long-prompts")
            child = subprocess.run(
                [sys.executable, "-c", KILLED_AT, str(config), point], capture_output=True, timeout=60
            )
            assert child.returncode == -9, (point, child.stderr.decode()[-2000:])
            # the restart: a new controller on the same state, no operator action
            with running(f.controller(rollout, name="llama")) as again:
                state, reports = wait_until(
                    lambda: _phase(again, "paused") and _converged(again, f), 15, f"convergence after {point}"
                )
            assert (state.stage, state.weights.long) == ("long-prompts@0", 50), point
            assert {(r.stage, r.version) for r in reports} == {("long-prompts@0", state.version)}, point
            history = controller.store.history()
            assert not [e for e in history if e["event"] == "halted"], (point, history[-10:])
            # every write that reached a gateway is in the audit log, recorded before it was sent
            sent = {(e["gateway"], e["version"]) for e in history if e["event"] == "write"}
            assert {(r.name, r.version) for r in reports} <= sent, point
            if point != "after-confirm":
                (resumed,) = [
                    e for e in history if e["event"] == "resuming" and e["version"] == state.version
                ]
                at = {"before-write:gw0": [], "after-write:gw0": ["gw0"], "before-write:gw1": ["gw0"]}
                assert resumed["gateways_at_version"] == at.get(point, ["gw0", "gw1"]), point
            # back to the stable stage for the next point
            with running(f.controller(rollout, name="llama")):
                commands.flag(controller, "abort")
                wait_until(lambda: _phase(controller, "aborted"), 30, "the abort")
                wait_until(lambda: _converged(controller, f), 30, "the fleet back on colocated")


def test_with_prometheus_hung_nothing_moves_on_and_abort_reaches_the_gateways_while_a_measurement_hangs(
    tmp_path: Path, colocated: SimProcess
) -> None:
    steps = [
        {"set_weight": {"short": 0, "long": 50}},
        {"pause": {"duration_s": 1}},
        {"set_weight": {"short": 0, "long": 100}},
    ]
    rollout = {**_rollout(steps), "consecutive_error_limit": 1000}
    with fleet(tmp_path, colocated.url, colocated.url) as f, hung_server() as hung:
        controller = f.controller(rollout, prometheus_url=hung, measure_timeout_s=3)
        with running(controller):
            wait_until(lambda: controller.store.load(), 30, "the controller's first state")
            commands.submit_rollout(controller, "long-prompts")
            wait_until(lambda: _converged(controller, f), 30, "50% on every gateway")

            def blind() -> list[str]:
                events = _events(controller, "measurement")
                return [r["message"] for e in events for r in e["results"]]  # type: ignore[union-attr]

            # a measurement given up at its deadline: time enough to end the 1 s pause, had one come back
            given_up = lambda: any("no answer within 3 s" in m for m in blind())  # noqa: E731
            wait_until(given_up, 20, "a measurement given up at its deadline")
            state = controller.store.load()
            assert state is not None and (state.step_index, state.weights.long) == (0, 50), state.reason
            assert "holding step 0: metrics error" in state.reason
            assert all("metrics error" in m for m in blind())
        # The abort does not wait for a measurement: the same rollout's controller whose measurement never
        # ends in this test (its client's timeout and its deadline an hour) takes the gateways back while
        # that measurement still hangs. One that waited for it would never get there.
        resumed = f.controller(rollout, prometheus_url=hung)
        config = resumed.config.model_copy(update={"measure_timeout_s": 3600.0})
        patient = Controller(config, PrometheusClient(hung, timeout=3600), resumed.gateways, resumed.store)
        with running(patient):
            hanging = wait_until(
                lambda: patient._inflight if patient._inflight and patient._inflight.is_alive() else None,
                30,
                "a measurement in flight",
                every=0.02,
            )
            with patient.store.locked(timeout_s=0.5):  # no tick holds the lock while measuring
                pass
            commands.flag(patient, "abort")
            wait_until(
                lambda: {(r.stage, r.weights.long) for r in f.reports(patient)} == {("colocated", 0)},
                30,
                "every gateway on the stable stage",
                every=0.02,
            )
            assert hanging.is_alive() and hanging is patient._inflight, "the abort waited for the measurement"
        assert _phase(patient, "aborted")


def test_a_plan_renamed_mid_rollout_halts_in_one_line_and_aborts_cleanly(
    tmp_path: Path, colocated: SimProcess
) -> None:
    steps = [
        {"set_weight": {"short": 0, "long": 50}},
        {"pause": {}},
        {"set_weight": {"short": 0, "long": 100}},
    ]
    with fleet(tmp_path, colocated.url, colocated.url) as f:
        controller = f.controller(_rollout(steps))
        with running(controller):
            wait_until(lambda: controller.store.load(), 30, "the controller's first state")
            commands.submit_rollout(controller, "long-prompts")
            wait_until(lambda: _phase(controller, "paused"), 30, "the pause at 50%")
        # the profile changes under the rollout: its plan (and stage) renamed, the controller restarted
        stages = {"colocated": {"short": 0, "long": 0}, "long-only": {"short": 0, "long": 100}}
        renamed = {**_rollout(steps), "plans": {"long-only": {"steps": steps}}}
        after = f.controller(renamed, stages=stages)
        state = after.tick()
        assert state.phase == "halted" and "\n" not in state.reason
        assert state.reason == (
            "halted: the profile has no rollout plan 'long-prompts' any more (plans: long-only); "
            "rollout.abort goes back to stage colocated"
        )
        assert after.tick() == state and len(_events(after, "halted")) == 1  # said once, ticks go on
        assert commands.status(after)["time_to_next_step_s"] is None
        commands.flag(after, "abort")
        state = after.tick()
        assert (state.phase, state.stage, state.applied_version) == ("aborted", "colocated", state.version)
        assert {(r.stage, r.version) for r in f.reports(after)} == {("colocated", state.version)}


# ---- two models behind the same gateways, each rolled out on its own ---------------------------------

TWO_STEPS = [
    {"set_weight": {"short": 0, "long": 50}},
    {"pause": {}},
    {"set_weight": {"short": 0, "long": 100}},
]


def _cli(config: Path, *args: str) -> tuple[int, str]:
    """pdfleet-rollout as the operator's invoke rollout runs it: exit code and stdout (or stderr)."""
    import contextlib
    import io

    from pdfleet.rollout.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--config", str(config), *args])
    return rc, out.getvalue() if rc == 0 else err.getvalue()


def test_two_models_roll_out_on_their_own_and_a_kill_mid_write_of_one_converges(
    tmp_path: Path, colocated: SimProcess
) -> None:
    """One controller process, two models sharing the gateways' policy version: `llama` stages the top
    level, `small` its group. Each model's rollout, promote and abort move its own stage and leave the
    other's as it was; the versions the gateways take rise across both; no step of one looks foreign to
    the other (no halt). Then the process is killed after writing small's next step to gw0 only, while
    llama sits at another version: the restart brings gw1 up and both models converge, no halt."""
    import json
    import subprocess
    import sys

    from pdfleet.rollout.cli import controllers_from

    with fleet(tmp_path, colocated.url, colocated.url, small=colocated.url) as f:
        rollout = {**_rollout(TWO_STEPS), "interval_s": 0.2}
        config = tmp_path / "controller.json"
        models = [{"name": "llama"}, {"name": "small", "group": "small"}]
        config.write_text(json.dumps(f.file([{**m, "rollout": rollout} for m in models])))
        both = controllers_from(config)
        llama, small = both.models

        def stages() -> tuple[tuple[str, int], tuple[str, int]]:
            top, group = f.reports(llama)[0], f.reports(llama, "small")[0]
            return (top.stage, top.weights.long), (group.stage, group.weights.long)

        def converged(c: Controller, group: str | None) -> object:
            state = c.store.load()
            reports = f.reports(c, group)
            if state is None or state.applied_version != state.version:
                return None
            same = {(r.stage, r.weights) for r in reports} == {(state.stage, state.weights)}
            return state if same else None

        stop = threading.Event()
        thread = threading.Thread(target=both.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_until(lambda: llama.store.load() and small.store.load(), 30, "both models' first states")
            rc, err = _cli(config, "submit", "--stage", "long-prompts")
            assert rc == 2 and "name one; models: llama, small" in err
            rc, err = _cli(config, "--model", "big", "submit", "--stage", "long-prompts")
            assert rc == 2 and "--model: no model 'big'; models: llama, small" in err
            assert _cli(config, "--model", "llama", "submit", "--stage", "long-prompts")[0] == 0
            wait_until(lambda: _phase(llama, "paused") and converged(llama, None), 30, "llama at 50%")
            assert stages() == (("long-prompts@0", 50), ("colocated", 0))
            assert _cli(config, "--model", "small", "submit", "--stage", "long-prompts")[0] == 0
            wait_until(lambda: _phase(small, "paused") and converged(small, "small"), 30, "small at 50%")
            assert stages() == (("long-prompts@0", 50), ("long-prompts@0", 50))
            assert _cli(config, "--model", "llama", "promote")[0] == 0
            wait_until(lambda: _phase(llama, "succeeded") and converged(llama, None), 30, "llama at 100%")
            assert stages() == (("long-prompts", 100), ("long-prompts@0", 50))
            rc, out = _cli(config, "status")
            assert rc == 0
            shown = {d["model"]: (d["phase"], d["stage"]) for d in json.loads(out)["models"]}
            assert shown == {"llama": ("succeeded", "long-prompts"), "small": ("paused", "long-prompts@0")}
        finally:
            stop.set()
            thread.join(10)
        assert not [e for c in both.models for e in c.store.history() if e["event"] == "halted"]
        applied = sorted((e["at"], e["version"]) for c in both.models for e in _events(c, "applied"))
        versions = [v for _, v in applied if v > 1]
        assert versions == sorted(set(versions)) and len(versions) >= 3  # rising across both models
        # the kill: small's promote (its next step, 100%) written to gw0 only, llama at another version
        assert _cli(config, "--model", "small", "promote")[0] == 0
        child = subprocess.run(
            [sys.executable, "-c", KILLED_AT, str(config), "after-write:gw0", "1"],
            capture_output=True,
            timeout=60,
        )
        assert child.returncode == -9, child.stderr.decode()[-2000:]
        saved = small.store.load()
        assert saved is not None and saved.applied_version < saved.version  # written ahead, unconfirmed
        gw = [r.version for r in f.reports(small, "small")]
        assert gw[0] == saved.version and gw[1] < saved.version
        again = controllers_from(config)
        stop = threading.Event()
        thread = threading.Thread(target=again.run, args=(stop,), daemon=True)
        thread.start()
        try:
            state = wait_until(
                lambda: _phase(small, "succeeded") and converged(small, "small"), 30, "small after the kill"
            )
            assert wait_until(lambda: converged(llama, None), 5, "llama still converged")
        finally:
            stop.set()
            thread.join(10)
        assert (state.phase, state.stage, state.weights.long) == ("succeeded", "long-prompts", 100)
        assert stages() == (("long-prompts", 100), ("long-prompts", 100))
        assert {r.version for r in f.reports(small)} == {state.version}
        assert not [e for c in both.models for e in c.store.history() if e["event"] == "halted"]
