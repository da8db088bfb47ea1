"""Provisioning: the per-host plan (roles → operations) that the runner applies, and its offline render."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

from rich.console import Console

from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import role_files
from pdfleet.model.inventory import Host
from pdfleet.ops.base import FactSource, Operation, Skip
from pdfleet.ops.report import console_progress
from pdfleet.ops.runner import Report, RunOptions, run_fleet


def plan_host(deployment: Deployment, host: Host, facts: FactSource) -> Iterator[Operation | Skip]:
    """The ordered operations of every role that applies to this host."""
    ctx = deployment.context(host)
    for role in deployment.roles:
        if role.applies(ctx):
            yield from role.operations(ctx, facts)


def render_fleet(deployment: Deployment, hosts: Iterable[Host]) -> dict[str, list[RenderedFile]]:
    """Every fact-independent file provision would install, per host."""
    return {host.name: role_files(deployment.roles, deployment.context(host)) for host in hosts}


def provision(deployment: Deployment, hosts: Sequence[Host], options: RunOptions, console: Console) -> Report:
    """Plan and (unless options.check) apply every host, showing per-host progress on `console`."""
    planner = functools.partial(plan_host, deployment)
    return run_fleet(hosts, planner, options, progress=console_progress(console))
