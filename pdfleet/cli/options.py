"""What tasks taking --profile/--inventory share: option help, building the deployment, runner options."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from invoke import Context

from pdfleet.cli import lab_site
from pdfleet.cli.settings import Settings, repo_path
from pdfleet.fleet.deployment import Deployment, load_deployment
from pdfleet.fleet.host_wheel import cached_host_wheel
from pdfleet.fleet.roles import select_roles
from pdfleet.fleet.secrets import gateway_secrets, review_secrets
from pdfleet.model.inventory import Host
from pdfleet.ops.runner import RunOptions
from roles import REGISTRY

HELP = {
    "profile": "Profile name from profiles/ (see `invoke profiles`) or a path to a profile YAML file.",
    "inventory": "Ansible-format YAML inventory (default: pdfleet.inventory in invoke.yaml, the lab).",
    "limit": "Only these hosts or groups, comma-separated (e.g. p1,decode).",
    "roles": "Only these roles, comma-separated, in their normal order (e.g. base,services).",
}


def deployment_from_options(
    ctx: Context,
    profile: str,
    inventory: str | None,
    roles: str | None = None,
    limit: str | None = None,
    review: bool = False,
) -> tuple[Deployment, list[Host]]:
    """The deployment and the `--limit`ed hosts from task options and invoke.yaml defaults. Everything is
    validated first; only then, and only when a selected role installs the gateway on a selected host,
    are the gateway's keys read or generated on the control machine (`review`: read, never generated;
    placeholders stand for missing ones)."""
    settings = Settings.of(ctx)
    deployment = load_deployment(
        profile,
        repo_path(inventory) if inventory else settings.inventory,
        profiles_dir=settings.profiles_dir,
        templates_dir=settings.templates_dir,
        roles=select_roles(REGISTRY, roles),
        lab_network=lab_site.LAB_NETWORK,
    )
    hosts = list(deployment.inventory.limit(limit).hosts.values())
    if not deployment.needs_gateway_keys(hosts):
        return deployment, hosts
    gw = deployment.profile.gateway
    keys = (review_secrets if review else gateway_secrets)(gw.client_key_file, gw.admin_key_file)
    return dataclasses.replace(deployment, gateway_secrets=keys), hosts


def with_host_wheel(deployment: Deployment, progress: Callable[[str], None]) -> Deployment:
    """Hosts that run pdfleet code (gateway hosts; every pool host of an `engine: sim` profile) install the
    host wheel. The lab's mirror gets the current one for the hosts that install it from the index;
    gateway hosts get the file uploaded (from the local cache), since a site's own index lacks it."""
    topology = deployment.topology
    if not topology.pdfleet_hosts:
        return deployment
    if topology.lab_hosts:
        lab_site.serve_host_wheel(deployment.profile)
    if not topology.gateways:
        return deployment
    return dataclasses.replace(deployment, host_wheel=cached_host_wheel(progress=progress))


def run_options(
    ctx: Context, check: bool = False, serial: int = 0, json: str | None = None, reboot: bool = False
) -> RunOptions:
    """Runner options from task flags and invoke.yaml."""
    settings = Settings.of(ctx)
    return RunOptions(
        check=check,
        serial=serial or None,
        known_hosts=settings.known_hosts,
        connect_timeout=settings.connect_timeout,
        json_path=repo_path(json) if json else None,
        reboot=reboot,
    )
