"""`invoke keys.add|list|rotate|revoke NAME` (issue 28): named client keys, applied to every gateway by a
reload (no restart, streams in flight finish).

Each command edits the registry on the control machine (`gateway.keys_dir`, pdfleet.fleet.named_keys:
hashes, dates and limits; each key's plaintext in its own 0600 NAME.key to hand to the client), then
provisions the gateway role on the gateway hosts, which rewrites their keys file and reloads the gateway
(`--no-apply`: edit only; a later `invoke provision` applies it). A key never reaches the terminal, a log
or a command line: commands print the key file's path. `keys.list` shows names, scopes, dates, models and
when each name was last used on the gateways (their `/admin/keys`, with the admin key), never a key.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from pdfleet.cli import lab_site
from pdfleet.cli.exits import user_errors
from pdfleet.cli.monitor import number
from pdfleet.cli.options import HELP, open_deployment, run_options
from pdfleet.errors import PdfleetError, ValidationError

if TYPE_CHECKING:  # imported when a task runs (pdfleet/cli/__init__.py)
    from pdfleet.fleet.deployment import Deployment
    from pdfleet.gateway.keys import KeyEntry
    from pdfleet.model.limits import KeyLimits

BASE = {
    "profile": HELP["profile"],
    "inventory": HELP["inventory"],
    "name": "The key's name (a-z, 0-9, _ . -).",
}
APPLY = "Provision the gateway role on the gateway hosts now (a reload); --no-apply only edits the registry."


def _keys_dir(deployment: Deployment) -> Path:
    return Path(deployment.profile.gateway.keys_dir).expanduser()


def _apply(ctx: Context, profile: str, inventory: str | None, deployment: Deployment) -> None:
    """Provision the gateway role on every gateway host: their keys file rewritten, the gateway reloaded."""
    from rich.console import Console

    from pdfleet.fleet.provision import provision as run_provision
    from pdfleet.ops.report import print_report

    hosts = ",".join(g.host for g in deployment.topology.gateways)
    if not hosts:
        print("the inventory has no gateway host: nothing to apply")
        return
    console = Console(stderr=True)
    fleet = open_deployment(
        ctx,
        profile,
        inventory,
        roles="gateway",
        limit=hosts,
        keys="provision",
        wheel=lambda msg: console.print(msg, highlight=False),
        fleet_layout=True,  # the policy keeps the colocated hosts the live layout gives
    )
    lab_site.require_routable(fleet.hosts)
    report = run_provision(fleet, fleet.hosts, run_options(ctx), console)
    print_report(report)
    if report.totals["failed"]:
        print(
            "the registry is edited but not every gateway took it: run "
            f"`invoke provision {profile} --roles gateway`"
        )
        raise Exit(code=1)


def _limits(
    models: str | None, rps: str | None, burst: str | None, concurrent: str | None
) -> KeyLimits | None:
    """A key's limits from the options (None: no limit of its own), checked as the gateway checks them."""
    from pdfleet.model.limits import KeyLimits

    given: dict[str, Any] = {}
    if models:
        given["models"] = [m.strip() for m in models.split(",") if m.strip()]
    if rps is not None:
        given["requests_per_second"] = number("--requests-per-second", rps, most=1_000_000.0)
    for flag, key, value in (("--burst", "burst", burst), ("--concurrent", "concurrent_streams", concurrent)):
        if value is not None:
            if not value.isdigit() or int(value) < 1:
                raise ValidationError(f"{flag}: {value!r} is not a whole number of at least 1")
            given[key] = int(value)
    if not given:
        return None
    try:
        return KeyLimits(**given)
    except ValueError as exc:
        raise ValidationError(f"the key's limits: {exc}") from None


def check_models(limits: KeyLimits | None, aliases: list[str]) -> None:
    """Refuse --models naming no alias of the profile (the gateways would refuse the keys file)."""
    unknown = [m for m in (limits.models or []) if m not in aliases] if limits else []
    if unknown:
        raise ValidationError(
            f"--models: {', '.join(unknown)}: not a model alias (aliases: {', '.join(aliases)})"
        )


def _aliases(deployment: Deployment) -> list[str]:
    served = [a for spec in deployment.profile.served for a in spec.aliases]
    return served + list(deployment.profile.gateway.outside)


@task(
    positional=[],  # `invoke keys.add --help` is help, not a key named --help
    help={
        **BASE,
        "models": "Only these model aliases, comma-separated (default: every alias); others answer 403.",
        "requests_per_second": "The key's own rate limit (default: the profile's limits).",
        "burst": "Its bucket size (default: one second's worth).",
        "concurrent": "Its requests in flight at most.",
        "expires_days": "Days until the key expires (default: never); the gateways refuse it afterwards.",
        "apply": APPLY,
    },
)
@user_errors
def add(
    ctx: Context,
    profile: str,
    name: str,
    inventory: str | None = None,
    models: str | None = None,
    requests_per_second: str | None = None,
    burst: str | None = None,
    concurrent: str | None = None,
    expires_days: str | None = None,
    apply: bool = True,
) -> None:
    """Add a named client key (its key in a new 0600 file), then reload it onto every gateway."""
    from pdfleet.fleet import named_keys
    from pdfleet.gateway.keys import hash_key

    deployment = open_deployment(ctx, profile, inventory)
    limits = _limits(models, requests_per_second, burst, concurrent)
    check_models(limits, _aliases(deployment))
    now = datetime.now(UTC)
    expires = None
    if expires_days is not None:
        expires = now + timedelta(days=number("--expires-days", expires_days, most=36500.0))
    keys_dir = _keys_dir(deployment)
    entries = named_keys.read_registry(keys_dir)
    named_keys.added(entries, name, "0" * 64, now, limits, expires)  # refused before a file is written
    path, key = named_keys.new_key_file(keys_dir, name)
    named_keys.write_registry(keys_dir, named_keys.added(entries, name, hash_key(key), now, limits, expires))
    print(f"key {name!r} added; hand its file to the client: {path}")
    if apply:
        _apply(ctx, profile, inventory, deployment)


@task(
    positional=[],  # `invoke keys.add --help` is help, not a key named --help
    help={
        **BASE,
        "grace_minutes": "How long the old key keeps working beside the new one (default 60).",
        "apply": APPLY,
    },
)
@user_errors
def rotate(
    ctx: Context,
    profile: str,
    name: str,
    inventory: str | None = None,
    grace_minutes: str = "60",
    apply: bool = True,
) -> None:
    """Give a named key a new key (its file rewritten); the old one works for the grace period, then not."""
    from pdfleet.fleet import named_keys
    from pdfleet.gateway.keys import hash_key

    deployment = open_deployment(ctx, profile, inventory)
    grace = timedelta(minutes=number("--grace-minutes", grace_minutes, most=60 * 24 * 365.0))
    keys_dir = _keys_dir(deployment)
    entries, now = named_keys.read_registry(keys_dir), datetime.now(UTC)
    named_keys.rotated(entries, name, "0" * 64, now, grace)  # refused before a file is written
    path, key = named_keys.new_key_file(keys_dir, name)
    named_keys.write_registry(keys_dir, named_keys.rotated(entries, name, hash_key(key), now, grace))
    ends = (now + grace).isoformat(timespec="seconds")
    print(f"key {name!r} rotated: the new key is in {path}; the old one works until {ends}")
    if apply:
        _apply(ctx, profile, inventory, deployment)


@task(positional=[], help={**BASE, "apply": APPLY})
@user_errors
def revoke(ctx: Context, profile: str, name: str, inventory: str | None = None, apply: bool = True) -> None:
    """Remove a named key (every key of its rotation, and its file); the gateways answer 401 after the
    reload."""
    from pdfleet.fleet import named_keys

    deployment = open_deployment(ctx, profile, inventory)
    keys_dir = _keys_dir(deployment)
    named_keys.write_registry(keys_dir, named_keys.revoked(named_keys.read_registry(keys_dir), name))
    named_keys.remove_key_file(keys_dir, name)
    print(f"key {name!r} revoked")
    if apply:
        _apply(ctx, profile, inventory, deployment)


def _last_used(deployment: Deployment) -> tuple[dict[str, float], list[str]]:
    """Each key name's latest use over the gateways, and a line per gateway that did not say."""
    from pdfleet.lab.network import lab_route_problem
    from pdfleet.rollout.config import GatewayTarget, read_admin_key
    from pdfleet.rollout.gateways import GatewayClient

    gateways = deployment.topology.gateways
    problem = lab_route_problem([urlparse(g.admin_url).hostname or "" for g in gateways])
    if problem:
        return {}, [problem]
    key = read_admin_key(Path(deployment.profile.gateway.admin_key_file).expanduser())
    client = GatewayClient(key, timeout_s=3.0, ca_file=gateways[0].ca_file if gateways else None)
    used: dict[str, float] = {}
    notes = []
    for g in gateways:
        try:
            for k in client.keys(GatewayTarget(name=g.host, admin_url=g.admin_url)):
                if isinstance(k.get("last_used"), (int, float)):
                    used[k["name"]] = max(used.get(k["name"], 0.0), float(k["last_used"]))
        except PdfleetError as exc:
            notes.append(f"last use unknown on {g.host}: {exc}")
    return used, notes


def rows(entries: tuple[KeyEntry, ...], used: dict[str, float], now: datetime) -> list[list[str]]:
    """keys.list's rows: name, created, status, models, last used (never a key or hash)."""
    from pdfleet.fleet import named_keys

    out = []
    for e in entries:
        newest = named_keys.current(entries, e.name) is e
        last = used.get(e.name)
        out.append(
            [
                e.name,
                "-" if e.created is None else e.created.isoformat(timespec="seconds"),
                named_keys.status(e, newest, now),
                ",".join(e.limits.models) if e.limits and e.limits.models else "all",
                "never" if last is None else datetime.fromtimestamp(last, UTC).isoformat(timespec="seconds"),
            ]
        )
    return out


@task(
    positional=[],
    help={
        **{k: v for k, v in BASE.items() if k != "name"},
        "offline": "Do not ask the gateways for last use.",
    },
)
@user_errors
def list_(ctx: Context, profile: str, inventory: str | None = None, offline: bool = False) -> None:
    """The named keys: name, created, active/grace/expired, models, last used on the gateways; never a key."""
    from pdfleet.fleet import named_keys

    deployment = open_deployment(ctx, profile, inventory)
    entries = named_keys.read_registry(_keys_dir(deployment))
    used, notes = ({}, ["--offline: last use not asked"]) if offline else _last_used(deployment)
    print(f"{'NAME':<20} {'CREATED':<26} {'STATUS':<36} {'MODELS':<24} LAST USED")
    for row in rows(entries, used, datetime.now(UTC)):
        print(f"{row[0]:<20} {row[1]:<26} {row[2]:<36} {row[3]:<24} {row[4]}")
    gw = deployment.profile.gateway
    print(
        f"and the profile's own keys: client ({gw.client_key_file}), admin ({gw.admin_key_file}), "
        f"controller, stage-only ({gw.controller_key_file})"
    )
    for note in notes:
        print(note)


def collection() -> Collection:
    """`keys.add`, `keys.list`, `keys.rotate`, `keys.revoke`."""
    ns = Collection("keys", add, rotate, revoke)
    ns.add_task(list_, name="list")
    return ns
