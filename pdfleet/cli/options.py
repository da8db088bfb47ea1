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
    from pdfleet.fleet.deployment import Deployment, DeploymentRequest, Secrets
    from pdfleet.fleet.layout_store import FleetLayout
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
    fleet_layout: bool = False,
    layout: HostPools | None = None,
) -> Deployment:
    """Every task's deployment, from its options and invoke.yaml's defaults, through the one door
    (fleet.deployment.load_deployment): `roles` (default all), `--limit`ed hosts, `--stage` (of the model
    `stage_model` names), the gateway's keys as `keys` says (asked only when a selected role installs them
    on a selected host) and, with `wheel` (progress messages), the host wheel the selected hosts install;
    with `manifests`, the staged models' manifests from their mirrors (when the weights role runs on a
    host serving one); the pool groups as the live layout left them (`invoke rebalance`): read from the
    fleet's gateway hosts with `fleet_layout` (the tasks that change or check hosts; the local copy
    refreshed), else the copy last read; the inventory's with `layout_from_inventory`; `layout`'s (the
    layouts a move goes through: `invoke rebalance`'s steps). Everything is validated first."""
    from pdfleet.fleet.alert_secrets import read_alert_secrets
    from pdfleet.fleet.deployment import DeploymentRequest, load_deployment
    from pdfleet.fleet.host_wheel import cached_host_wheel
    from pdfleet.fleet.roles import select_roles
    from pdfleet.fleet.weights import load_manifests, load_tokens
    from roles import REGISTRY

    settings = Settings.of(ctx)
    inventory_path = repo_path(inventory) if inventory else settings.inventory
    selected = select_roles(REGISTRY, roles)  # a bad --roles is refused before any host is contacted
    plain = DeploymentRequest(
        profile,
        inventory_path,
        settings.profiles_dir,
        settings.templates_dir,
        lab_network=lab_site.LAB_NETWORK,
        limit=limit,
        stage=stage,
        stage_model=stage_model,
    )
    # no profile: the one door names the missing option (a layout file of no profile means nothing)
    live: tuple[str, HostPools] | None = None
    if layout is not None:
        live = ("the layout of a step of invoke rebalance", layout)
    elif profile and not layout_from_inventory:
        live = _live_layout(ctx, plain, inventory, fleet_layout)
    request = DeploymentRequest(
        profile,
        inventory_path,
        settings.profiles_dir,
        settings.templates_dir,
        roles=selected,
        lab_network=lab_site.LAB_NETWORK,
        limit=limit,
        stage=stage,
        stage_model=stage_model,
        secrets=_secrets(keys),
        host_wheel=None if wheel is None else functools.partial(cached_host_wheel, progress=wheel),
        manifests=load_manifests if manifests else None,
        hub_tokens=load_tokens if manifests else None,
        alert_secrets=read_alert_secrets if keys == "provision" else None,
        layout=live,
    )
    deployment = load_deployment(request)
    if wheel is not None:
        lab_site.serve_host_wheel(deployment)
    return deployment


def _live_layout(
    ctx: Context, plain: DeploymentRequest, inventory: str | None, fleet: bool
) -> tuple[str, HostPools] | None:
    """The live layout a deployment takes and where it was read: from the fleet's gateway hosts (`fleet`),
    else the copy last read from them; None: the inventory's. `plain`: the plainest deployment of the
    task's profile, inventory, --limit and --stage."""
    from pdfleet.fleet.deployment import load_deployment
    from pdfleet.fleet.live_layout import read_copy

    state = live_layout_file(ctx, plain.profile, inventory)
    if not fleet:
        copy = read_copy(state)
        return None if copy is None else (str(state), copy)
    load_deployment(plain)  # bad input is refused before any host is contacted
    store = fleet_layouts(ctx, plain.profile, inventory)
    live = refresh_copy(ctx, plain.profile, inventory, store)
    return None if live is None else (store.path, live)


def live_layout_file(ctx: Context, profile: str, inventory: str | None) -> Path:
    """The control machine's copy of the live layout of a profile on an inventory, last read from the
    fleet (fleet.live_layout), under pdfleet.output_dir."""
    from pdfleet.fleet.live_layout import copy_file

    settings = Settings.of(ctx)
    return copy_file(settings.output_dir, repo_path(inventory) if inventory else settings.inventory, profile)


def fleet_layouts(ctx: Context, profile: str, inventory: str | None) -> FleetLayout:
    """The profile's live layout on the fleet: kept on the inventory's gateway hosts, reached over SSH."""
    from pdfleet.fleet.layout_store import FleetLayout
    from pdfleet.model.inventory import Host, load_inventory
    from pdfleet.ops.ssh import Transport, open_connection

    settings = Settings.of(ctx)
    inv = load_inventory(repo_path(inventory) if inventory else settings.inventory)
    keepers = [inv.hosts[name] for name in inv.groups.get("gateway", ())]
    lab_site.require_routable(keepers)

    def connect(host: Host) -> Transport:
        return open_connection(host, settings.known_hosts, settings.connect_timeout)

    return FleetLayout(keepers, connect, profile)


def refresh_copy(ctx: Context, profile: str, inventory: str | None, store: FleetLayout) -> HostPools | None:
    """The live layout the fleet keeps, its copy on the control machine refreshed (removed when none)."""
    from pdfleet.fleet.live_layout import agreed_layout, write_copy

    texts = store.texts()
    live = agreed_layout(texts, store.path)
    write_copy(live_layout_file(ctx, profile, inventory), next((t for t in texts.values() if t), None))
    return live


def layout_note(ctx: Context, profile: str, inventory: str | None, fleet: bool = False) -> str:
    """Which layout a task's deployment shows: the fleet's (`fleet`: read from its gateway hosts just
    now), the copy last read from the fleet, or the inventory's."""
    state = live_layout_file(ctx, profile, inventory)
    reset = "`invoke provision --layout-from-inventory` resets it"
    if fleet:
        if state.exists():
            return f"layout: the live layout the gateway hosts keep (left by invoke rebalance; {reset})"
        return "layout: the inventory's pool groups (the gateway hosts keep no live layout)"
    if state.exists():
        return (
            f"layout: the live layout as last read from the fleet's gateway hosts, copied in {state} "
            f"(left by invoke rebalance; {reset})"
        )
    return (
        "layout: the inventory's pool groups (no live layout read from the fleet on this machine; "
        "provision, verify and rebalance read it from the gateway hosts)"
    )


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
