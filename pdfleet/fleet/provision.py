"""Provisioning: the per-host plan (roles → operations) that the runner applies, and its offline render."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from rich.console import Console

from pdfleet.fleet.host_version import wheel_version
from pdfleet.fleet.pools import host_instances
from pdfleet.fleet.render import RenderedFile, Renderer
from pdfleet.fleet.roles import RoleContext, load_roles, role_files
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.model.inventory import Host, Inventory, load_inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import Profile
from pdfleet.model.profile_loader import load_profile
from pdfleet.ops.base import FactSource, Operation, Skip
from pdfleet.ops.report import console_progress
from pdfleet.ops.runner import Report, RunOptions, run_fleet


@dataclass(frozen=True)
class Deployment:
    """One validated profile and inventory, built once per command and passed down."""

    profile: Profile
    inventory: Inventory
    roles: list[ModuleType]
    renderer: Renderer
    pdfleet_version: str
    gateway_secrets: GatewaySecrets | None = None
    pdfleet_wheel: Path | None = None  # this clone's host wheel, uploaded by the roles needing it

    def context(self, host: Host) -> RoleContext:
        """What the roles see for one host, with its vLLM instances computed once."""
        instances = host_instances(self.profile, host)
        return RoleContext(host, self.inventory, self.profile, self.renderer, instances, self.pdfleet_version,
                           self.gateway_secrets, self.pdfleet_wheel)


def load_deployment(
    profile: str,
    inventory: str | Path,
    profiles_dir: Path,
    templates_dir: Path,
    roles: str | None = None,
    gateway_secrets: GatewaySecrets | None = None,
) -> Deployment:
    """Load and cross-check profile and inventory; raise ValidationError before anything is touched.

    Without `gateway_secrets` the gateway role has no keys to install (it skips, saying so)."""
    prof = load_profile(profile, profiles_dir)
    inv = load_inventory(inventory)
    check_against_inventory(prof, inv)
    return Deployment(prof, inv, load_roles(roles), Renderer(templates_dir), wheel_version(), gateway_secrets)


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
