"""`invoke rollout --stage S [--model M]` and `rollout.status|abort|promote|history`: the operator's side
of the rollout, as Argo's CLI is: each edits the controller's state of one model or reads it, on the
monitoring host over SSH (`pdfleet-rollout ...` as the service user); the controller does the rest by
itself. Each model of a profile rolls out on its own; `--model` names which (needed when there are
several), `rollout.status` shows every model without it. Ctrl-C while watching stops the watching, not
the rollout."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from invoke import Collection, Context, task

from pdfleet.cli import lab_site
from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP, open_deployment
from pdfleet.cli.settings import Settings, repo_path
from pdfleet.errors import ConnectError, PdfleetError, ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.fleet.topology import Controller

WATCH_EVERY_S = 1.0
ENDED = ("succeeded", "degraded", "aborted", "idle")
# where following stops: an end, or a halt (it waits for a gateway or an operator, not for time)
STOPS = (*ENDED, "halted")
NOT_DONE = {
    "degraded": "rolled back by the controller",
    "aborted": "rolled back by rollout.abort",
    "halted": "halted, nothing moves until it is resolved (invoke rollout.status; rollout.abort goes back)",
}


class RolloutNotDone(PdfleetError):
    """The rollout followed ended without reaching its target (rolled back or halted): exit 1, as
    `kubectl argo rollouts status` exits non-zero on Degraded, so a pipeline gating on it stops."""

    exit_code = 1


Remote = Callable[[list[str]], str]


def remote_argv(controller: Controller, args: list[str]) -> str:
    """The command line run on the monitoring host: pdfleet-rollout as the service user (sudo -n)."""
    from pdfleet.fleet.host_layout import SERVICE_USER

    argv = ["sudo", "-n", "-u", SERVICE_USER, controller.bin, "--config", controller.config_file, *args]
    return " ".join(shlex.quote(a) for a in argv)


def _remote(ctx: Context, profile: str | None, inventory: str | None) -> tuple[Deployment | None, Remote]:
    """The deployment (when a profile is given: checked against the inventory) and a runner of
    pdfleet-rollout commands on the inventory's monitoring host."""
    from pdfleet.fleet.topology import controller_of
    from pdfleet.model.inventory import load_inventory
    from pdfleet.ops.ssh import open_connection

    settings = Settings.of(ctx)
    deployment = None if profile is None else open_deployment(ctx, profile, inventory)
    if deployment is None:  # no profile: the inventory alone says where the controller runs
        controller = controller_of(load_inventory(repo_path(inventory) if inventory else settings.inventory))
    else:
        controller = deployment.topology.controller or controller_of(deployment.inventory)
    if controller is None:
        raise ValidationError("the inventory has no host in the `monitoring` group: no rollout controller")
    host = controller.host

    def run(args: list[str]) -> str:
        lab_site.require_routable([host])  # at the first connection: bad input is refused before it
        conn = open_connection(host, settings.known_hosts, settings.connect_timeout)
        try:
            out = conn.run(remote_argv(controller, args), timeout=60)
        finally:
            conn.close()
        if out.rc != 0:
            message = out.stderr.strip().removeprefix("error: ") or f"exit {out.rc}"
            raise ConnectError(f"{host.name}: pdfleet-rollout {args[0]}: {message}")
        return out.stdout

    return deployment, run


def _number(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.4g}{unit}"


def format_status(doc: dict[str, Any]) -> str:
    """The live view of one model: phase, step, weights, version, each gate against its threshold, time
    to next step."""
    weights = doc.get("weights") or {}
    model = f"model {doc['model']}: " if doc.get("model") else ""
    if doc.get("error"):
        return f"{model}{doc['error']}\n"
    lines = [
        f"{model}rollout to {doc.get('target') or '-'}: {doc.get('phase')} "
        f"(step {doc.get('step_index', 0) + 1} of {doc.get('steps', 0)})",
        f"stage {doc.get('stage')} (version {doc.get('version')}, applied {doc.get('applied_version')}), "
        f"disaggregated: short {weights.get('short')}%, long {weights.get('long')}%; "
        f"stable stage {doc.get('stable_stage')}",
    ]
    if doc.get("reason"):
        lines.append(f"reason: {doc['reason']}")
    nxt = doc.get("time_to_next_step_s")
    if doc.get("phase") in ("progressing", "paused"):
        when = "on rollout.promote" if nxt is None else f"in {nxt:.0f} s at the earliest"
        lines.append(f"next step: {when}")
    if "reason_mix" in doc:
        lines.append(reason_line(doc["reason_mix"], doc.get("reason_window_s")))
    results = doc.get("last_results") or []
    if results:
        lines.append(f"{'gate':<28} {'class':<6} {'value':>10} {'threshold':>10}  outcome")
        for r in results:
            tag = " (dry run)" if r.get("dry_run") else ""
            lines.append(
                f"{r['gate']:<28} {r['length_class']:<6} {_number(r.get('value')):>10} "
                f"{_number(r.get('threshold')):>10}  {r['outcome']}{tag}"
            )
    return "\n".join(lines) + "\n"


def reason_line(mix: dict[str, float] | str, window_s: float | None) -> str:
    """Why requests were (not) disaggregated over the gates' window: each decider reason's share."""
    from pdfleet.gateway.decider import reason_mix_text

    span = f" over the last {window_s:g} s" if window_s else ""
    text = reason_mix_text(mix) if isinstance(mix, dict) else mix
    return f"decider reasons{span}: {text}"


def format_statuses(doc: dict[str, Any]) -> str:
    """Every model's live view (pdfleet-rollout status), a blank line between models."""
    return "\n".join(format_status(one) for one in doc.get("models") or [])


def model_args(model: str | None) -> list[str]:
    """pdfleet-rollout's --model (nothing: the only model, or every model for status and history)."""
    return [] if model is None else ["--model", model]


def check_target(deployment: Deployment, model: str | None, stage: str) -> None:
    """--model names a model of the profile and --stage one of its plans (ValidationError naming the
    known ones); nothing is sent otherwise."""
    spec = deployment.profile.served_model(model)
    plans = spec.rollout.plans
    if stage not in plans:
        raise ValidationError(
            f"--stage: model {spec.name} has no rollout plan for {stage!r}; "
            f"plans: {', '.join(plans) or 'none'}"
        )


def format_evaluation(doc: dict[str, Any]) -> str:
    """A dry run's gates."""
    head = (
        f"dry run for {doc['target']} at stage {doc['stage']} (version {doc['version']}), "
        f"{doc['samples']} samples in the window; nothing changed\n"
    )
    return head + format_status({"phase": "dry-run", "last_results": doc["results"]}).split("\n", 2)[-1]


def follow(
    run: Remote, out: Callable[[str], None], every_s: float = WATCH_EVERY_S, model: str | None = None
) -> dict[str, Any]:
    """Print one model's live view until its rollout ends; Ctrl-C stops watching only."""
    doc: dict[str, Any] = {}
    try:
        while True:
            doc = json.loads(run([*model_args(model), "status"]))["models"][0]
            out("\033[H\033[2J" + format_status(doc))
            if doc.get("phase") in STOPS:
                return doc
            time.sleep(every_s)
    except KeyboardInterrupt:
        out("\nstopped watching; the rollout goes on on the monitoring host (invoke rollout.status)\n")
        return doc


def verdict(doc: dict[str, Any], target: str) -> str:
    """The last line of a followed rollout when it reached its target; RolloutNotDone (saying why)
    when it was rolled back or halted."""
    phase = str(doc.get("phase"))
    why = f": {doc['reason']}" if doc.get("reason") else ""
    if phase in NOT_DONE:
        raise RolloutNotDone(f"the rollout to {target} did not complete: {phase}, {NOT_DONE[phase]}{why}")
    if phase == "succeeded":
        at = f"stage {doc.get('stage')} (version {doc.get('version')})"
        return f"rollout to {target} succeeded: traffic at {at}\n"
    return f"stopped following the rollout to {target} ({phase}); invoke rollout.status shows it\n"


def submitted(doc: dict[str, Any]) -> str:
    """What --no-watch prints: what was submitted and how to follow it."""
    return (
        f"submitted: rollout to {doc.get('target')} from stable stage {doc.get('stable_stage')} "
        f"(traffic now at {doc.get('stage')}, version {doc.get('version')}); the controller on the "
        "monitoring host runs it.\n"
        "follow it: invoke rollout.status (the live view), invoke rollout.history (the audit log); "
        "go back: invoke rollout.abort\n"
    )


def _print(text: str) -> None:
    print(text, end="", flush=True)


PROFILE_HELP = {
    "profile": "Optional: " + HELP["profile"] + " Given, --model and --stage are checked against it.",
    "inventory": HELP["inventory"],
}
MODEL_HELP = (
    "The model whose rollout this is (a name under the profile's models:); needed when the profile "
    "serves several, each rolls out on its own."
)


@task(
    default=True,
    help={
        **PROFILE_HELP,
        "stage": "The target stage (a plan in the model's rollout.plans, e.g. long-prompts).",
        "model": MODEL_HELP,
        "dry_run": "Measure the gates a rollout to the stage would use, now; change nothing.",
        "watch": "Follow the live view until the rollout ends, exit 1 if it was rolled back or halted "
        "(default on; --no-watch submits, says how to follow it and returns).",
    },
)
@user_errors
def start(
    ctx: Context,
    stage: str,
    profile: str | None = None,
    inventory: str | None = None,
    dry_run: bool = False,
    watch: bool = True,
    model: str | None = None,
) -> None:
    """Submit a rollout of one model to a stage and follow it (Ctrl-C stops watching, not the rollout);
    exits 1 when the rollout followed is rolled back or halted. Other models' stages are not touched."""
    deployment, run = _remote(ctx, profile, inventory)
    if deployment is not None:
        check_target(deployment, model, stage)
    which = model_args(model)
    if dry_run:
        _print(format_evaluation(json.loads(run([*which, "evaluate", "--stage", stage]))))
        return
    doc = json.loads(run([*which, "submit", "--stage", stage]))
    if not watch:
        _print(submitted(doc))
        return
    _print(verdict(follow(run, _print, model=model), stage))


def _known(ctx: Context, profile: str | None, inventory: str | None, model: str | None) -> Remote:
    """The remote runner, --model checked against the profile when one is given."""
    deployment, run = _remote(ctx, profile, inventory)
    if deployment is not None and model is not None:
        deployment.profile.served_model(model)
    return run


@task(help={**PROFILE_HELP, "model": "Only this model (default: every model, one after the other)."})
@user_errors
def status(
    ctx: Context, profile: str | None = None, inventory: str | None = None, model: str | None = None
) -> None:
    """The live state of every model (or one): step, weights, each gate's value against its threshold."""
    run = _known(ctx, profile, inventory, model)
    _print(format_statuses(json.loads(run([*model_args(model), "status"]))))


@task(help={**PROFILE_HELP, "model": MODEL_HELP})
@user_errors
def abort(
    ctx: Context, profile: str | None = None, inventory: str | None = None, model: str | None = None
) -> None:
    """Go back to the model's last stable stage now."""
    run = _known(ctx, profile, inventory, model)
    doc = json.loads(run([*model_args(model), "abort"]))
    _print(f"abort requested: the controller returns to stage {doc['stable_stage']} at its next tick\n")


@task(
    help={
        **PROFILE_HELP,
        "model": MODEL_HELP,
        "full": "Skip every remaining step and analysis (Argo's promote --full).",
    }
)
@user_errors
def promote(
    ctx: Context,
    profile: str | None = None,
    inventory: str | None = None,
    full: bool = False,
    model: str | None = None,
) -> None:
    """End the model's current pause (or an inconclusive analysis); --full skips the rest."""
    run = _known(ctx, profile, inventory, model)
    run([*model_args(model), "promote", *(["--full"] if full else [])])
    _print("promoted: " + ("every remaining step skipped\n" if full else "the current pause ends\n"))


@task(
    help={
        **PROFILE_HELP,
        "last": "Only the last N events (default 0: all).",
        "model": "Only this model's events (default: every model's, by time, each naming its model).",
    }
)
@user_errors
def history(
    ctx: Context,
    profile: str | None = None,
    inventory: str | None = None,
    last: int = 0,
    model: str | None = None,
) -> None:
    """The audit log: every transition and measurement, one JSON object a line."""
    if last < 0:
        raise ValidationError(f"--last must be 0 (all) or a positive count, not {last}")
    run = _known(ctx, profile, inventory, model)
    _print(run([*model_args(model), "history", "--last", str(last)]))


def collection() -> Collection:
    """`rollout` (submit and watch) with status, abort, promote and history under it."""
    return Collection("rollout", start, status, abort, promote, history)
