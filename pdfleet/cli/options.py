"""Option parsing shared by tasks that take --profile/--inventory: one place for defaults and help."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from invoke import Context

from pdfleet.cli._common import REPO_ROOT, repo_path, setting
from pdfleet.errors import ConnectError
from pdfleet.fleet.host_wheel import clone_wheel, wheel_name
from pdfleet.fleet.provision import Deployment, load_deployment
from pdfleet.fleet.secrets import gateway_secrets
from pdfleet.lab.mirrors import refresh_if_served_here
from pdfleet.lab.network import lab_route_problem
from pdfleet.lab.paths import LabPaths
from pdfleet.model.inventory import Host
from pdfleet.ops.runner import RunOptions

HELP = {
    "profile": "Profile name from profiles/ (see `invoke profiles`) or a path to a profile YAML file.",
    "inventory": "Ansible-format YAML inventory (default: pdfleet.model.inventory in invoke.yaml, the lab).",
    "limit": "Only these hosts or groups, comma-separated (e.g. p1,decode).",
    "roles": "Only these roles, comma-separated, in their normal order (e.g. base,services).",
}


def deployment_from_options(
    ctx: Context, profile: str, inventory: str | None, roles: str | None = None
) -> Deployment:
    """Load profile + inventory from task options and invoke.yaml defaults; the gateway's keys are
    generated on the control machine when missing (only their hashes go into the deployment)."""
    inv = inventory or setting(ctx, "inventory", "inventory/lab.yml")
    deployment = load_deployment(
        profile,
        repo_path(inv),
        profiles_dir=repo_path(setting(ctx, "profiles_dir", "profiles")),
        templates_dir=repo_path(setting(ctx, "templates_dir", "templates")),
        roles=roles,
    )
    # only once the input is known good: bad input must not leave key files behind
    gw = deployment.profile.gateway
    keys = gateway_secrets(gw.client_key_file, gw.admin_key_file)
    return dataclasses.replace(deployment, gateway_secrets=keys)


def with_clone_wheel(deployment: Deployment, progress: Callable[[str], None]) -> Deployment:
    """Hosts that run pdfleet code (gateway hosts; all hosts of an `engine: sim` profile) install this
    clone's wheel. When their PyPI mirror is the one this machine serves (the lab's), put the current
    wheel on it. The gateway role also uploads the wheel file (the lab's, else one built into the local
    cache), since a site's own index does not carry it."""
    prof = deployment.profile
    gateway = prof.pools.colocated is not None and any(
        h.in_group("gateway") for h in deployment.inventory.hosts.values()
    )
    if not gateway and prof.vllm.engine != "sim":
        return deployment
    version = refresh_if_served_here(prof.mirrors.pypi)
    if not gateway:
        return deployment
    if version is not None:
        wheel = LabPaths().pypi_dir / "packages" / wheel_name(version)
    else:
        wheel = clone_wheel(REPO_ROOT, progress=progress)
    return dataclasses.replace(deployment, pdfleet_wheel=wheel)


def output_dir(ctx: Context, out: str | None) -> Path:
    return repo_path(out or setting(ctx, "output_dir", "out"))


def known_hosts(ctx: Context) -> str:
    """The fallback known_hosts file for hosts without pdfleet_known_hosts_file."""
    return str(Path(setting(ctx, "known_hosts", "~/.ssh/known_hosts")).expanduser())


def run_options(
    ctx: Context, check: bool = False, serial: int = 0, json: str | None = None, reboot: bool = False
) -> RunOptions:
    """Runner options from task flags and invoke.yaml."""
    return RunOptions(
        check=check,
        serial=serial or None,
        known_hosts=known_hosts(ctx),
        connect_timeout=float(setting(ctx, "connect_timeout", 10)),
        json_path=repo_path(json) if json else None,
        reboot=reboot,
    )


def require_routable(hosts: Sequence[Host]) -> None:
    """Refuse to connect to lab addresses while the lab is down (the traffic would leave this machine)."""
    problem = lab_route_problem(h.address for h in hosts)
    if problem:
        raise ConnectError(problem)
