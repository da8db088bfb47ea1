"""rollout: the `pdfleet-rollout` controller on the monitoring group, beside Prometheus.

It owns the live stage (state under /var/lib/pdfleet/rollout, 0700) and applies it to every gateway
host through the gateway's admin endpoint (`POST /admin/stage`) with the admin key, which it reads from
a 0600 file only it can read; the key is never on a command line or in a log. Installed only when the
profile has a rollout plan and the topology has gateways.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from pdfleet.fleet.host_layout import SERVICE_USER, UNIT_DIR
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, host_wheel_install
from pdfleet.model.connectors import NIXL
from pdfleet.model.monitoring import has_nixl_metrics
from pdfleet.monitoring.monitoring_config import listen_address
from pdfleet.ops.base import FactSource, Operation, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler

NAME = "rollout"
APT_PACKAGES: tuple[str, ...] = ()

CONFIG_DIR = "/etc/pdfleet/rollout"
CONFIG_FILE = f"{CONFIG_DIR}/controller.json"
KEY_FILE = f"{CONFIG_DIR}/admin.key"
STATE_DIR = "/var/lib/pdfleet/rollout"
VENV = "/opt/pdfleet/rollout"
UNIT = "pdfleet-rollout.service"
BIN = f"{VENV}/bin/pdfleet-rollout"


def applies(ctx: RoleContext) -> bool:
    return ctx.host.in_group("monitoring")


def _why_not(ctx: RoleContext) -> str | None:
    if not ctx.topology.gateways:
        return "the topology has no gateway: there is no stage to roll out"
    if not ctx.profile.rollout.plans:
        return "the profile has no rollout.plans"
    if ctx.gateway_secrets is None or ctx.gateway_secrets.admin_key is None:
        return "no gateway admin key was provided (provision reads it on the control machine)"
    return None


def controller_config(ctx: RoleContext) -> str:
    """controller.json: the profile's plans, gates, stages and SLOs; the gateways' admin URLs."""
    profile = ctx.profile
    gateways = [
        {"name": g.host, "admin_url": f"http://{g.address}:{g.admin_port or g.port}"}
        for g in ctx.topology.gateways
    ]
    kv_metrics = (
        profile.disaggregated
        and profile.kv_transfer.connector == NIXL
        and has_nixl_metrics(profile.vllm.engine, profile.vllm.version)
    )
    doc = {
        "profile": profile.name,
        "rollout": profile.rollout.model_dump(mode="json"),
        "stages": {k: v.model_dump() for k, v in profile.gateway.stages.items()},
        "initial_stage": profile.gateway.stage,
        "slo": profile.slo.model_dump(exclude_none=True),  # unset P95 bounds fall back to P99 in bench only
        "gateways": gateways,
        "prometheus_url": f"http://{listen_address(profile, ctx.host)}",
        "admin_key_file": KEY_FILE,
        "state_dir": STATE_DIR,
        "kv_transfer_metrics": kv_metrics,
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def files(ctx: RoleContext) -> list[RenderedFile]:
    if _why_not(ctx):
        return []
    secrets = ctx.gateway_secrets
    assert secrets is not None and secrets.admin_key is not None
    owner = {"owner": SERVICE_USER, "group": SERVICE_USER}
    unit = ctx.render(
        "pdfleet-rollout.service.j2",
        service_user=SERVICE_USER,
        state_directory=STATE_DIR.removeprefix("/var/lib/"),
        argv=[BIN, "--config", CONFIG_FILE, "run"],
    )
    return [
        RenderedFile(CONFIG_FILE, controller_config(ctx), mode="0644"),
        RenderedFile(KEY_FILE, secrets.admin_key + "\n", mode="0600", secret=True, **owner),
        RenderedFile(f"{UNIT_DIR}/{UNIT}", unit),
    ]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return [] if _why_not(ctx) else [ManagedUnit(UNIT, None, None)]


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    reason = _why_not(ctx)
    if reason:
        yield Skip("rollout", reason)
        return
    restart = restart_handler(UNIT, None, 60)
    yield from host_wheel_install(ctx, VENV, notify=(restart,))
    yield Directory(CONFIG_DIR, mode="0755")
    for rendered in files(ctx):
        name = rendered.path.rsplit("/", 1)[1]
        if rendered.path.startswith(UNIT_DIR):
            yield SystemdUnit(name, rendered.content.encode(), restart=restart)
        else:
            yield File(
                rendered.path,
                rendered.content.encode(),
                mode=rendered.mode,
                owner=rendered.owner,
                group=rendered.group,
                secret=rendered.secret,
                notify=(restart,),
            )
    yield Service(UNIT, enabled=True, running=True)
