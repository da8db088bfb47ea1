"""Provisioning: the per-host plan (roles → operations) that the runner applies, the facts its first batch
gathers (what the host runs, and what the host's roles declare they read), and its offline render. The
live-stage rule (provision never moves traffic by itself) is pdfleet.fleet.live_stage."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from rich.console import Console

from pdfleet.fleet.deployment import Deployment
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import role_files
from pdfleet.hw import HardwareError
from pdfleet.hw.distro import PlatformRefusal, resolve_platform
from pdfleet.hw.os_facts import OsReleaseFact
from pdfleet.model.inventory import Host
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.report import console_progress
from pdfleet.ops.runner import Report, RunOptions, run_fleet


def plan_host(deployment: Deployment, host: Host, facts: FactSource) -> Iterator[Operation | Skip]:
    """The ordered operations of every role that applies to this host; a host on a platform pdfleet does not
    provision is refused first, whichever roles run (`--roles`), so nothing is planned or installed there."""
    try:
        resolve_platform(host.name, facts.get(OsReleaseFact()))
    except PlatformRefusal as exc:
        raise HardwareError(str(exc)) from None
    ctx = deployment.context(host)
    for role in deployment.roles:
        if role.applies(ctx):
            yield from role.operations(ctx, facts)


def host_facts(deployment: Deployment, host: Host) -> tuple[Fact[Any], ...]:
    """The facts worth gathering in a host's first batch: the union of what the roles that apply to it
    declare they read (role.facts). A fact missing there still works (gathered when read), at the cost of
    one more round trip."""
    ctx = deployment.context(host)
    found = (fact for role in deployment.roles if role.applies(ctx) for fact in role.facts(ctx))
    return tuple(dict.fromkeys((OsReleaseFact(), *found)))


def render_fleet(deployment: Deployment, hosts: Iterable[Host]) -> dict[str, list[RenderedFile]]:
    """Every fact-independent file provision would install, per host."""
    return {host.name: role_files(deployment.roles, deployment.context(host)) for host in hosts}


def provision(deployment: Deployment, hosts: Sequence[Host], options: RunOptions, console: Console) -> Report:
    """Plan and (unless options.check) apply every host, showing per-host progress on `console`."""
    planner = functools.partial(plan_host, deployment)
    prefetch = functools.partial(host_facts, deployment)
    return run_fleet(hosts, planner, options, progress=console_progress(console), prefetch=prefetch)
