"""What tasks taking --profile/--inventory share: option help, building the deployment, runner options."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from invoke import Context

from pdfleet.cli import lab_site
from pdfleet.cli.settings import Settings, repo_path

if TYPE_CHECKING:  # the fleet's machinery is imported when a task runs, not when invoke lists the tasks
    from pdfleet.fleet.deployment import Deployment, Secrets
    from pdfleet.fleet.live_layout import HostPools
    from pdfleet.ops.runner import RunOptions

HELP = {
    "profile": "Profile name from profiles/ (see `invoke profiles`) or a path to a profile YAML file.",
    "inventory": "Ansible-format YAML inventory (default: pdfleet.inventory in invoke.yaml, the lab).",
    "limit": "Only these hosts or groups, comma-separated (e.g. p1,decode).",
    "roles": "Only these roles, comma-separated, in their normal order (e.g. base,services).",
}


Keys = Literal["none", "provision", "review"]


def _secrets(keys: Keys) -> Secrets | None:
    """How a task reads the gateway's keys."""
    from pdfleet.fleet.secrets import gateway_secrets, review_secrets

    return {
        "none": None,  # the command installs nothing: no key is read
        "provision": gateway_secrets,  # read, generated when missing (only their hashes reach hosts)
        "review": review_secrets,  # read, never generated: placeholders stand for missing ones (render)
    }[keys]


def open_deployment(
    ctx: Context,
    profile: str,
    inventory: str | None,
    *,
    roles: str | None = None,
    limit: str | None = None,
    stage: str | None = None,
    stage_model: str | None = None,
    keys: Keys = "none",
    wheel: Callable[[str], None] | None = None,
    manifests: bool = False,
    layout_from_inventory: bool = False,
    layout: HostPools | None = None,
) -> Deployment:
    """Every task's deployment, from its options and invoke.yaml's defaults, through the one door
    (fleet.deployment.load_deployment): `roles` (default all), `--limit`ed hosts, `--stage` (of the model
    `stage_model` names), the gateway's keys as `keys` says (asked only when a selected role installs them
    on a selected host) and, with `wheel` (progress messages), the host wheel the selected hosts install;
    with `manifests`, the staged models' manifests from their mirrors (when the weights role runs on a
    host serving one); the pool groups as the live layout left them (`invoke rebalance`) unless
    `layout_from_inventory`, or as `layout` gives them (the layouts a move goes through: `invoke
    rebalance`'s steps). Everything is validated first."""
    from pdfleet.fleet.alert_secrets import read_alert_secrets
    from pdfleet.fleet.deployment import DeploymentRequest, load_deployment
    from pdfleet.fleet.host_wheel import cached_host_wheel
    from pdfleet.fleet.live_layout import read_layout
    from pdfleet.fleet.roles import select_roles
    from pdfleet.fleet.weights import load_manifests, load_tokens
    from roles import REGISTRY

    settings = Settings.of(ctx)
    inventory_path = repo_path(inventory) if inventory else settings.inventory
    state = live_layout_file(ctx, profile or "", inventory)
    # no profile: the one door names the missing option (a layout file of no profile means nothing)
    live = None if layout_from_inventory or not profile else read_layout(state)
    if layout is not None:
        live = layout
    request = DeploymentRequest(
        profile,
        inventory_path,
        settings.profiles_dir,
        settings.templates_dir,
        roles=select_roles(REGISTRY, roles),
        lab_network=lab_site.LAB_NETWORK,
        limit=limit,
        stage=stage,
        stage_model=stage_model,
        secrets=_secrets(keys),
        host_wheel=None if wheel is None else functools.partial(cached_host_wheel, progress=wheel),
        manifests=load_manifests if manifests else None,
        hub_tokens=load_tokens if manifests else None,
        alert_secrets=read_alert_secrets if keys == "provision" else None,
        layout=None if live is None else (state, live),
    )
    deployment = load_deployment(request)
    if wheel is not None:
        lab_site.serve_host_wheel(deployment)
    return deployment


def live_layout_file(ctx: Context, profile: str, inventory: str | None) -> Path:
    """The state file of the live layout of a profile on an inventory (fleet.live_layout), under
    pdfleet.output_dir."""
    from pdfleet.fleet.live_layout import layout_file

    settings = Settings.of(ctx)
    return layout_file(
        settings.output_dir, repo_path(inventory) if inventory else settings.inventory, profile
    )


def layout_note(ctx: Context, profile: str, inventory: str | None) -> str:
    """Which layout a task's deployment shows: the live one (and where it is kept) or the inventory's."""
    state = live_layout_file(ctx, profile, inventory)
    if state.exists():
        return (
            f"layout: the live layout in {state} (left by invoke rebalance; "
            "`invoke provision --layout-from-inventory` resets it)"
        )
    return "layout: the inventory's pool groups (no host was moved by invoke rebalance)"


def run_options(
    ctx: Context, check: bool = False, serial: int = 0, json: str | None = None, reboot: bool = False
) -> RunOptions:
    """Runner options from task flags and invoke.yaml."""
    from pdfleet.ops.runner import RunOptions

    settings = Settings.of(ctx)
    return RunOptions(
        check=check,
        serial=serial or None,
        known_hosts=settings.known_hosts,
        connect_timeout=settings.connect_timeout,
        json_path=repo_path(json) if json else None,
        reboot=reboot,
    )
