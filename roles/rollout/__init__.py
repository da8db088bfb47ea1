"""rollout: the `pdfleet-rollout` controller on the monitoring group, beside Prometheus.

It owns each model's live stage (state under the topology's controller.state_dir/<model>/, 0700) and
applies it to every gateway host through the gateway's admin endpoint (`POST /admin/stage`) with the
controller's stage-only key (gateway.controller_key_file: it may read the policy and set the stage,
nothing else; the admin key stays on the control machine), which it reads from a 0600 file only it can
read; the key is never on a command line or in a log. Installed on the first monitoring host only when a
model of the profile has a rollout plan and the topology has gateways (Topology.controller says where and
with which paths; the key's file keeps its old name, admin.key, so provision overwrites the admin key that
controllers before issue 28 held).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.host_layout import GATEWAY_CA_FILE, SERVICE_USER, UNIT_DIR
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import (
    ManagedUnit,
    RoleContext,
    gateway_ca_files,
    gateway_ca_operations,
    host_wheel_install,
)
from pdfleet.fleet.topology import Controller
from pdfleet.model.served import ServedModel
from pdfleet.monitoring.recording import kv_series
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import Directory, File
from pdfleet.ops.systemd import Service, SystemdUnit, restart_handler

NAME = "rollout"
APT_PACKAGES: tuple[str, ...] = ()


def applies(ctx: RoleContext) -> bool:
    return ctx.topology.prometheus_on(ctx.host.name) is not None


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return ()  # its operations() reads no fact


def _why_not(ctx: RoleContext) -> str | None:
    controller = ctx.topology.controller
    if controller is None:
        return ctx.topology.no_controller_reason
    if controller.host.name != ctx.host.name:
        return f"the controller runs on the first monitoring host, {controller.host.name}"
    if ctx.gateway_secrets is None or ctx.gateway_secrets.controller_key is None:
        return "no controller key was provided (provision reads or generates it on the control machine)"
    return None


def _controller(ctx: RoleContext) -> Controller:
    controller = ctx.topology.controller
    assert controller is not None, "_why_not() admits only the controller's host"
    return controller


def controller_config(ctx: RoleContext) -> str:
    """controller.json: the gateways' admin URLs, Prometheus, and per model (the profile's order) its plans,
    gates, stages and SLOs, the gateway group it stages and the `model` label of its series. In a `models:`
    profile every model stages its own policy group and measures its own series (the first one too: its
    group reads as the top-level stage until a rollout gives it one, and `invoke provision --stage` sets
    it back to following the top level); a single-model profile, whose policy has no groups, stages the
    top level and measures every series (its gateway labels requests by alias)."""
    controller = _controller(ctx)
    prometheus = ctx.topology.prometheus_on(ctx.host.name)
    assert prometheus is not None, "the controller runs on a monitoring host"
    gateways = [{"name": g.host, "admin_url": g.admin_url} for g in ctx.topology.gateways]
    served = ctx.profile.served
    doc = {
        "profile": ctx.profile.name,
        "gateways": gateways,
        "prometheus_url": prometheus.url,
        "stage_key_file": controller.key_file,
        "state_dir": controller.state_dir,
        "models": [_model_part(ctx, spec, bool(ctx.profile.models)) for spec in served],
    }
    if any(g.scheme == "https" for g in ctx.topology.gateways):
        doc["gateway_ca_file"] = GATEWAY_CA_FILE  # what the controller verifies the gateways with
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _model_part(ctx: RoleContext, spec: ServedModel, listed: bool) -> dict[str, Any]:
    """One model's part of controller.json (config.ModelControl); `listed`: the profile has `models:`."""
    profile = ctx.profile.for_model(spec)
    kv = kv_series(profile)  # its connector's own histogram (Mooncake's on P), or none on this release
    return {
        "name": spec.name,
        "group": spec.name if listed else None,
        "model": spec.name if listed else None,
        # rebalance's automatic mode only when it is on (off, the file is as before issue 35's keys)
        "rollout": spec.rollout.model_dump(mode="json", exclude=_off(spec)),
        "stages": {k: v.model_dump() for k, v in spec.gateway.stages.items()},
        "initial_stage": spec.gateway.stage,
        "slo": spec.slo.model_dump(exclude_none=True),  # unset P95 bounds fall back to P99 in bench only
        "kv_transfer_metrics": kv is not None,
        **({"kv_transfer_histogram": kv.histogram, "kv_transfer_role": kv.role} if kv else {}),
    }


def files(ctx: RoleContext) -> list[RenderedFile]:
    if _why_not(ctx):
        return []
    secrets = ctx.gateway_secrets
    assert secrets is not None and secrets.controller_key is not None
    controller = _controller(ctx)
    owner = {"owner": SERVICE_USER, "group": SERVICE_USER}
    unit = ctx.render(
        "pdfleet-rollout.service.j2",
        service_user=SERVICE_USER,
        state_directory=controller.state_dir.removeprefix("/var/lib/"),
        argv=[controller.bin, "--config", controller.config_file, "run"],
    )
    return [
        RenderedFile(controller.config_file, controller_config(ctx), mode="0644"),
        RenderedFile(controller.key_file, secrets.controller_key + "\n", mode="0600", secret=True, **owner),
        RenderedFile(f"{UNIT_DIR}/{controller.unit}", unit),
        *gateway_ca_files(ctx),
    ]


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return [] if _why_not(ctx) else [ManagedUnit(_controller(ctx).unit, None, None)]


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    reason = _why_not(ctx)
    if reason:
        yield Skip("rollout", reason)
        return
    controller = _controller(ctx)
    restart = restart_handler(controller.unit, None, 60)
    yield from host_wheel_install(ctx, controller.venv, notify=(restart,))
    yield Directory(controller.config_dir, mode="0755")
    yield from gateway_ca_operations(ctx, notify=(restart,))
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
    yield Service(controller.unit, enabled=True, running=True)


def _off(spec: ServedModel) -> set[str] | None:
    """What controller.json leaves out of a model's rollout section: rebalance, while its automatic mode is
    off (the controller reads the default then, and the file stays as before)."""
    return {"rebalance"} if spec.rollout.rebalance.mode == "off" else None
