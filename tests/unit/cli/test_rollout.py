"""The operator's rollout tasks: the command sent to the monitoring host, the live view (each gate
against its threshold, time to the next step), watching that Ctrl-C ends without touching the rollout,
and bad input refused before any connection."""

from __future__ import annotations

import json
import shlex

import pytest
from invoke.exceptions import Exit

from pdfleet.cli import rollout
from pdfleet.fleet.topology import controller_of
from pdfleet.model.inventory import load_inventory
from tests.unit.cli.helpers import REPO, project_context

STATUS = {
    "phase": "progressing",
    "target": "long-prompts",
    "step_index": 1,
    "steps": 8,
    "stage": "long-prompts@0",
    "version": 7,
    "applied_version": 7,
    "weights": {"short": 0, "long": 10},
    "stable_stage": "colocated",
    "reason": "waiting for samples: 12 of 50 samples in the window",
    "time_to_next_step_s": 18.2,
    "last_results": [
        {
            "gate": "ttft-p99-vs-colocated",
            "length_class": "long",
            "value": 812.5,
            "threshold": 1200.0,
            "outcome": "pass",
            "dry_run": False,
        },
        {
            "gate": "kv-transfer-p99-slo",
            "length_class": "long",
            "value": None,
            "threshold": None,
            "outcome": "inconclusive",
            "dry_run": True,
        },
    ],
}


def test_the_remote_command_runs_the_controller_cli_as_the_service_user() -> None:
    controller = controller_of(load_inventory(REPO / "inventory" / "lab.yml"))
    assert controller is not None and controller.host.name == "lab-gw"
    argv = shlex.split(rollout.remote_argv(controller, ["submit", "--stage", "long-prompts; rm -rf /"]))
    assert argv[:4] == ["sudo", "-n", "-u", "pdfleet"]
    assert argv[4:] == [
        "/opt/pdfleet/rollout/bin/pdfleet-rollout",
        "--config",
        "/etc/pdfleet/rollout/controller.json",
        "submit",
        "--stage",
        "long-prompts; rm -rf /",
    ]


def test_the_live_view_shows_step_weights_gates_and_time_to_next_step() -> None:
    text = rollout.format_status(STATUS)
    assert "rollout to long-prompts: progressing (step 2 of 8)" in text
    assert "version 7, applied 7" in text and "long 10%" in text and "stable stage colocated" in text
    assert "next step: in 18 s at the earliest" in text
    assert "ttft-p99-vs-colocated" in text and "812.5" in text and "1200" in text
    assert "kv-transfer-p99-slo" in text and "inconclusive (dry run)" in text
    paused = rollout.format_status({**STATUS, "phase": "paused", "time_to_next_step_s": None})
    assert "next step: on rollout.promote" in paused


def test_the_live_view_shows_the_decider_reason_mix_or_why_there_is_none() -> None:
    mix = {"stage_weight": 300.0, "cached_prefix": 90.0, "short": 10.0}
    text = rollout.format_status({**STATUS, "reason_mix": mix, "reason_window_s": 60})
    line = "decider reasons over the last 60 s: stage_weight 75%, short 2%, cached_prefix 22% of 400 requests"
    assert line in text
    absent = "no data: the gateways have decided no request yet"
    assert f"decider reasons over the last 60 s: {absent}" in rollout.format_status(
        {**STATUS, "reason_mix": absent, "reason_window_s": 60}
    )
    assert "decider reasons" not in rollout.format_status(STATUS)  # a controller from before the mix


def test_status_shows_every_model_each_named() -> None:
    doc = {
        "models": [
            {**STATUS, "model": "llama-8b"},
            {"model": "llama-1b", "phase": None, "error": "the controller has not saved a state yet"},
        ]
    }
    text = rollout.format_statuses(doc)
    assert "model llama-8b: rollout to long-prompts: progressing (step 2 of 8)" in text
    assert "model llama-1b: the controller has not saved a state yet" in text


def test_a_dry_run_says_nothing_changed() -> None:
    doc = {
        "dry_run": True,
        "target": "long-prompts",
        "stage": "colocated",
        "version": 3,
        "samples": 0,
        "results": STATUS["last_results"],
    }
    text = rollout.format_evaluation(doc)
    assert "dry run for long-prompts at stage colocated (version 3)" in text and "nothing changed" in text
    assert "ttft-p99-vs-colocated" in text


def test_watching_ends_with_the_rollout_and_ctrl_c_only_stops_watching() -> None:
    docs = iter([{**STATUS}, {**STATUS, "phase": "succeeded", "last_results": []}])
    shown: list[str] = []
    calls: list[list[str]] = []

    def run(args: list[str]) -> str:
        calls.append(args)
        return json.dumps({"models": [next(docs)]})

    assert rollout.follow(run, shown.append, every_s=0)["phase"] == "succeeded"
    assert calls == [["status"], ["status"]]
    calls.clear()
    docs = iter([{**STATUS, "phase": "succeeded"}])
    rollout.follow(run, shown.append, every_s=0, model="llama-8b")
    assert calls == [["--model", "llama-8b", "status"]]

    def interrupted(args: list[str]) -> str:
        calls.append(args)
        raise KeyboardInterrupt

    calls.clear()
    rollout.follow(interrupted, shown.append, every_s=0)
    assert calls == [["status"]]  # no abort, no other command: the rollout goes on
    assert "stopped watching; the rollout goes on" in shown[-1]


def test_bad_input_is_refused_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    ctx = project_context()
    with pytest.raises(Exit):
        rollout.start(ctx, stage="nowhere", profile="lab-cross")
    err = capsys.readouterr().err
    assert "no rollout plan for 'nowhere'; plans: canary-long, long-prompts, all-disagg" in err
    with pytest.raises(Exit):
        rollout.start(ctx, stage="long-prompts", profile="lab-two-models", model="llama-70b")
    assert "no model 'llama-70b' (--model): llama-8b, llama-1b" in capsys.readouterr().err
    with pytest.raises(Exit):  # two models: which one is the operator's to say
        rollout.start(ctx, stage="long-prompts", profile="lab-two-models")
    assert "several models; name one (--model): llama-8b, llama-1b" in capsys.readouterr().err
    with pytest.raises(Exit):
        rollout.abort(ctx, profile="lab-two-models", model="nope")
    assert "no model 'nope' (--model)" in capsys.readouterr().err
    with pytest.raises(Exit):
        rollout.history(ctx, last=-1)
    assert "--last must be 0 (all) or a positive count" in capsys.readouterr().err


def test_following_stops_on_a_halt_and_a_rollout_not_completed_exits_non_zero() -> None:
    docs = iter([{**STATUS}, {**STATUS, "phase": "halted", "reason": "halted: gateway gw1 is not answering"}])
    doc = rollout.follow(lambda args: json.dumps({"models": [next(docs)]}), [].append, every_s=0)
    assert doc["phase"] == "halted"
    for phase, says in [
        (
            "halted",
            "halted, nothing moves until it is resolved (invoke rollout.status; rollout.abort goes back)",
        ),
        ("degraded", "rolled back by the controller"),
        ("aborted", "rolled back by rollout.abort"),
    ]:
        with pytest.raises(rollout.RolloutNotDone) as err:
            rollout.verdict(
                {**STATUS, "phase": phase, "reason": "gate failed: fallback-rate"}, "long-prompts"
            )
        assert err.value.exit_code == 1
        assert str(err.value) == (
            f"the rollout to long-prompts did not complete: {phase}, {says}: gate failed: fallback-rate"
        )
    done = {**STATUS, "phase": "succeeded", "stage": "long-prompts", "version": 9}
    assert rollout.verdict(done, "long-prompts") == (
        "rollout to long-prompts succeeded: traffic at stage long-prompts (version 9)\n"
    )


def test_no_watch_says_what_was_submitted_and_how_to_follow_it() -> None:
    text = rollout.submitted({**STATUS, "phase": "progressing", "stage": "colocated", "version": 3})
    assert text.startswith("submitted: rollout to long-prompts from stable stage colocated")
    assert "invoke rollout.status" in text and "invoke rollout.abort" in text
