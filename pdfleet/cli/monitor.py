"""`invoke monitor`: the request chain per model, pool and class from Prometheus, now and over the last
minutes (a section per model, or the one `--model` names), then what is firing (Alertmanager's API v2)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from invoke import Context, task

from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP, open_deployment
from pdfleet.errors import ConnectError, ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.model.profile import Profile
    from pdfleet.model.served import ServedModel

MIN_INTERVAL_S = 1.0
MAX_MINUTES = 366 * 24 * 60.0  # a year: far past any retention; a larger one overflowed a timestamp


@task(
    positional=[],  # `invoke TASK --help` is help, not a profile named --help
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "minutes": "The second column set: quantiles over the last N minutes (default 10; at least 1).",
        "watch": "Refresh the table every --interval seconds until Ctrl-C.",
        "interval": "Seconds between refreshes with --watch (default 5; at least 1).",
        "prometheus": "Read this Prometheus (http://HOST:PORT) instead of the inventory's monitoring host.",
        "model": "Show only this model (its name in the profile's models:); default: every model, a section "
        "each.",
        "alertmanager": "Read this Alertmanager (http://HOST:PORT) instead of the one beside the inventory's "
        "Prometheus.",
    },
)
@user_errors
def monitor(
    ctx: Context,
    profile: str,
    inventory: str | None = None,
    minutes: str = "10",
    watch: bool = False,
    interval: str = "5",
    prometheus: str | None = None,
    model: str | None = None,
    alertmanager: str | None = None,
) -> None:
    """Show TTFT, queue, prefill, KV transfer, decode, TPOT, ITL, stalls per model, pool and class, and
    the alerts firing."""
    from pdfleet.lab.network import lab_route_problem
    from pdfleet.metrics.prometheus import PrometheusClient
    from pdfleet.monitoring.chain_table import (
        format_table,
        model_labels,
        of_model,
        prometheus_url,
        read_chain,
    )
    from pdfleet.monitoring.firing import alertmanager_url, firing_section

    span = number("--minutes", minutes, most=MAX_MINUTES)
    every = number("--interval", interval)
    if every < MIN_INTERVAL_S:
        raise ValidationError(f"--interval: {every:g} s is less than {MIN_INTERVAL_S:g} s")
    deployment = open_deployment(ctx, profile, inventory)
    shown = shown_models(deployment.profile, model)
    url = prometheus_url(deployment.topology, prometheus)
    am_url = alertmanager_url(deployment.topology, alertmanager)
    # a lab address while the lab is down would route off this machine: refuse, as verify does (for
    # Alertmanager: its section says so, the chain is still worth showing)
    problem = lab_route_problem([urlparse(url).hostname or ""])
    am_problem = lab_route_problem([urlparse(am_url).hostname or ""]) if am_url else None
    if problem:
        raise ConnectError(problem)
    client = PrometheusClient(url)
    while True:
        table = read_chain(client, deployment.profile, deployment.topology, span)
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        name = deployment.profile.name
        text = "\n".join(
            format_table(
                of_model(table, model_labels(spec)),
                f"pdfleet monitor — {name}{_of(deployment.profile, spec)} — {url} — {stamp}",
            )
            for spec in shown
        )
        text += "\n" + (f"Alerts: {am_problem}\n" if am_problem else firing_section(am_url))
        if watch:
            print("\033[H\033[2J", end="")  # clear the terminal between refreshes
        print(text, end="", flush=True)
        if not watch:
            return
        try:
            time.sleep(every)
        except KeyboardInterrupt:
            return


def shown_models(profile: Profile, name: str | None) -> tuple[ServedModel, ...]:
    """The models to show: the one `--model` names (an unknown one refused, naming the known ones), else
    every model the profile serves."""
    return profile.served if name is None else (profile.served_model(name),)


def _of(profile: Profile, spec: ServedModel) -> str:
    """` — model M` in a section's title when the profile serves several models."""
    return f" — model {spec.name}" if len(profile.served) > 1 else ""


def number(option: str, text: str, most: float = 86_400.0) -> float:
    """A finite number up to `most` from an option's text (invoke's own float parsing ends in a
    traceback, and a huge one overflowed a timestamp or a sleep further on)."""
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"{option}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValidationError(f"{option}: {text!r} is not a finite number")
    if value > most:
        raise ValidationError(f"{option}: {text} is more than {most:g}")
    return value
