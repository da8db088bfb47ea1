"""`invoke shadow --stage S --share N [--minutes M]` and `shadow.status|stop|report` (issue 33): measure
the P/D pool on live requests before any user is moved.

`shadow` starts a run on every gateway of the profile (`POST /admin/shadow` with the admin key, the
rollout's path to the gateways: pdfleet.rollout.gateways, the URLs from the topology), then shows a live
view of each gateway's run until it ends; Ctrl-C there stops the run on every gateway (`--detach`: start
and return). `shadow.status` shows each gateway's run, `shadow.stop` ends it, `shadow.report` reads the
shadow series from Prometheus and prints the bench's table and verdict for live traffic
(pdfleet.bench.shadow_report).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from invoke import Collection, Context, task

from pdfleet.cli.bench import thresholds_of
from pdfleet.cli.exits import user_errors
from pdfleet.cli.monitor import number
from pdfleet.cli.options import HELP, open_deployment
from pdfleet.errors import ConnectError, PdfleetError, ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.rollout.config import GatewayTarget
    from pdfleet.rollout.gateways import GatewayClient

WATCH_EVERY_S = 2.0
MAX_MINUTES = 7 * 24 * 60.0
MODEL_HELP = "Only this model of the profile (default: every model behind the gateways)."
GATEWAYS_HELP = {"profile": HELP["profile"], "inventory": HELP["inventory"]}
BASE_HELP = {**GATEWAYS_HELP, "model": MODEL_HELP}


def _gateways(deployment: Deployment) -> tuple[GatewayClient, list[GatewayTarget]]:
    """The admin client (the profile's admin key file) and every gateway's admin URL (the topology)."""
    from pdfleet.lab.network import lab_route_problem
    from pdfleet.rollout.config import GatewayTarget, read_admin_key
    from pdfleet.rollout.gateways import GatewayClient

    gateways = deployment.topology.gateways
    if not gateways:
        raise ValidationError("the inventory has no gateway host: nothing to shadow")
    hosts = [urlparse(g.admin_url).hostname or "" for g in gateways]
    problem = lab_route_problem(hosts)  # a lab address while the lab is down would leave this machine
    if problem:
        raise ConnectError(problem)
    key = read_admin_key(Path(deployment.profile.gateway.admin_key_file).expanduser())
    return GatewayClient(key, timeout_s=5.0, ca_file=gateways[0].ca_file), [
        GatewayTarget(name=g.host, admin_url=g.admin_url) for g in gateways
    ]


def _gateway_model(deployment: Deployment, model: str | None) -> tuple[str | None, str | None]:
    """(the gateways' `model` label, vLLM's) of `--model` (None: every model): a single-model profile's
    gateway labels its series with the alias, a several-model one with the model's name."""
    if model is None:
        return None, None
    served = deployment.profile.served
    spec = deployment.profile.served_model(model)
    return (spec.name if len(served) > 1 else spec.aliases[0]), spec.name


def _each(
    client: GatewayClient, targets: list[GatewayTarget], body: dict[str, Any] | None
) -> dict[str, dict[str, Any]]:
    """Every gateway's answer by name; the first that fails is the error (naming it)."""
    return {t.name: client.shadow(t, body) for t in targets}


def _line(name: str, doc: dict[str, Any]) -> str:
    """One gateway's run in a line."""
    run = doc.get("running")
    if run is None:
        last = doc.get("last")
        if last is None:
            return f"{name}: no shadow run"
        return (
            f"{name}: off (last: stage {last['stage']}, {last['share']}%, ended {last.get('ended')}, "
            f"{last['sent']} sent, {last['ok']} ok, {last['failed']} failed, dropped {last['dropped'] or 0})"
        )
    return (
        f"{name}: shadowing stage {run['stage']} at {run['share']}%"
        f"{' of ' + run['model'] if run.get('model') else ''}, {run['seconds_left']:.0f} s left: "
        f"{run['sent']} sent, {run['ok']} ok, {run['failed']} failed, {doc['in_flight']} in flight, "
        f"dropped {run['dropped'] or 0}"
    )


def _print_status(docs: dict[str, dict[str, Any]], out: Callable[[str], None] = print) -> None:
    for name, doc in docs.items():
        out(_line(name, doc))


@task(
    default=True,
    help={
        **BASE_HELP,
        "stage": "The stage whose classes to shadow (its percentage for a class > 0), e.g. long-prompts.",
        "share": "Percent of those classes' sticky buckets to shadow, 1-100 (conversations shadowed whole).",
        "minutes": "How long the run lasts (default 10); the gateways end it by themselves.",
        "detach": "Start the run and return (default: a live view until it ends; Ctrl-C stops the run).",
    },
)
@user_errors
def start(
    ctx: Context,
    profile: str,
    stage: str,
    share: str,
    inventory: str | None = None,
    minutes: str = "10",
    model: str | None = None,
    detach: bool = False,
) -> None:
    """Start shadowing a share of a stage's classes to the P/D pool on every gateway; a live view."""
    try:
        pct = int(share)
    except ValueError:
        raise ValidationError(f"--share: {share!r} is not a whole percent (1-100)") from None
    if not 1 <= pct <= 100:
        raise ValidationError(f"--share: {pct} is not between 1 and 100")
    span = number("--minutes", minutes, most=MAX_MINUTES)
    if span <= 0:
        raise ValidationError(f"--minutes: {minutes} must be more than 0")
    deployment = open_deployment(ctx, profile, inventory)
    label, _ = _gateway_model(deployment, model)
    client, targets = _gateways(deployment)
    body: dict[str, Any] = {"action": "start", "stage": stage, "share": pct, "minutes": span}
    if label is not None:
        body["model"] = label
    try:
        _print_status(_each(client, targets, body))
    except PdfleetError:
        _stop_quietly(client, targets)  # none half started
        raise
    if detach:
        return
    _follow(client, targets)


def _stop_quietly(client: GatewayClient, targets: list[GatewayTarget]) -> None:
    """Stop the run on every gateway that answers (after a failed start, on Ctrl-C)."""
    for t in targets:
        with contextlib.suppress(PdfleetError):
            client.shadow(t, {"action": "stop"})


def _follow(client: GatewayClient, targets: list[GatewayTarget]) -> None:
    """The live view until every gateway's run ended; Ctrl-C stops the run everywhere."""
    from rich.console import Console

    console = Console()
    try:
        while True:
            time.sleep(WATCH_EVERY_S)
            docs = _each(client, targets, None)
            console.print(time.strftime("%H:%M:%S"), highlight=False)
            _print_status(docs, lambda s: console.print("  " + s, highlight=False))
            if all(d.get("running") is None for d in docs.values()):
                return
    except KeyboardInterrupt:
        _stop_quietly(client, targets)
        console.print("shadow: stopped on every gateway")


@task(help=GATEWAYS_HELP)
@user_errors
def status(ctx: Context, profile: str, inventory: str | None = None) -> None:
    """Each gateway's shadow run: stage, share, time left, sent, ok, failed, dropped by reason."""
    deployment = open_deployment(ctx, profile, inventory)
    client, targets = _gateways(deployment)
    _print_status(_each(client, targets, None))


@task(help=GATEWAYS_HELP)
@user_errors
def stop(ctx: Context, profile: str, inventory: str | None = None) -> None:
    """End the shadow run on every gateway (its shadows in flight are cut, counted `stopped`)."""
    deployment = open_deployment(ctx, profile, inventory)
    client, targets = _gateways(deployment)
    _print_status(_each(client, targets, {"action": "stop"}))


@task(
    help={
        **BASE_HELP,
        "minutes": "The window to report on, up to now (default 10).",
        "prometheus": "Read this Prometheus (http://HOST:PORT) instead of the inventory's monitoring host.",
        "as_json": "Print the report as JSON instead of tables.",
    }
)
@user_errors
def report(
    ctx: Context,
    profile: str,
    inventory: str | None = None,
    minutes: str = "10",
    model: str | None = None,
    prometheus: str | None = None,
    as_json: bool = False,
) -> None:
    """Primary against shadow per class and length bin, stalls caused by long prefills, the verdict."""
    from rich.console import Console
    from rich.table import Table

    from pdfleet.bench.fleet_targets import bench_model, kv_histogram
    from pdfleet.bench.shadow_report import COLUMNS, as_dict, build_report, table_rows
    from pdfleet.lab.network import lab_route_problem
    from pdfleet.metrics.prometheus import PrometheusClient
    from pdfleet.monitoring.chain_table import prometheus_url

    span = number("--minutes", minutes, most=MAX_MINUTES)
    if span <= 0:
        raise ValidationError(f"--minutes: {minutes} must be more than 0")
    deployment = open_deployment(ctx, profile, inventory)
    label, vllm_label = _gateway_model(deployment, model)
    url = prometheus_url(deployment.topology, prometheus)
    problem = lab_route_problem([urlparse(url).hostname or ""])
    if problem:
        raise ConnectError(problem)
    kv = kv_histogram(
        deployment.profile, bench_model(deployment.profile, model)
    )  # --model's, or the P/D one's
    found = build_report(
        PrometheusClient(url), span * 60, thresholds_of(deployment, model), label, vllm_label, kv
    )
    if as_json:
        print(json.dumps(as_dict(found), indent=2, default=str))
        return
    out = Console(width=160)
    table = Table(title=f"shadow: primary (colocated) vs shadow (P/D), last {span:g} min")
    for column in COLUMNS:
        table.add_column(column, justify="left" if column in ("class", "bin", "side") else "right")
    for row in table_rows(found):
        table.add_row(*row)
    out.print(table)
    for cls, n in sorted(found.long_prefill.items()):
        out.print(
            f"colocated {cls} streams beside a long prefill on their instance: {n['overlaps']:.0f}, "
            f"stalls caused by long prefills: {n['stalls']:.0f}",
            highlight=False,
        )
    assert found.verdict is not None
    out.print(f"verdict: {found.verdict.headline}", highlight=False)
    for line in [*found.verdict.warnings, *found.notes]:
        out.print(f"note: {line}", highlight=False)


def collection() -> Collection:
    """`shadow` (start and follow) with status, stop and report under it."""
    return Collection("shadow", start, status, stop, report)
