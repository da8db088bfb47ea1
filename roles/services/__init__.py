"""services: env files (0600) and systemd units for every vLLM instance the host runs, whatever model it
serves (a staged model's from its staged directory, offline: roles/weights); enabled, started, and only
reported started once /health answers. First, on every host, it retires the vLLM and vllm-router units
pdfleet installed that the profile no longer puts there (a renamed instance, a dropped pool, another
profile's model), so none keeps holding a port its successor needs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.host_layout import CONFIG_DIR, KV_ENV_FILE, SERVICE_USER, STATE_DIR, VLLM_START_TIMEOUT_S
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, instance_restart, instance_unit
from pdfleet.fleet.topology import Instance
from pdfleet.fleet.vllm_args import serve_argv
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import File
from pdfleet.ops.systemd import ManagedUnitFiles, RetireUnits, Service, SystemdUnit

NAME = "services"
APT_PACKAGES: tuple[str, ...] = ()
# vllm-{pool}, vllm-{model}-{pool}, vllm-router-pd and vllm-router-{model}-pd: the vLLM instances' units
# (this role's) and the P/D routers' (the gateway role's, which runs after this one)
UNIT_GLOB = "vllm-*.service"


def applies(ctx: RoleContext) -> bool:
    return True  # every host: one that runs no instance any more may still hold old ones to retire


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return (ManagedUnitFiles(UNIT_GLOB),)


def retire(ctx: RoleContext) -> RetireUnits:
    """The removal of pdfleet's vLLM/router units this host does not run under the profile."""
    keep = {inst.unit for inst in ctx.instances} | {r.unit for r in ctx.topology.routers_on(ctx.host.name)}
    return RetireUnits(UNIT_GLOB, frozenset(keep), env_dir=CONFIG_DIR)


def _hf_env(ctx: RoleContext, inst: Instance) -> dict[str, str]:
    """Hugging Face's cache; and offline for a staged model (roles/weights put every file it reads on the
    host, so the hub is never asked: an air-gapped site works and no host loads another revision)."""
    env = {"HF_HOME": f"{STATE_DIR}/hf"}
    if ctx.profile.served_model(inst.model).model.staged:
        env["HF_HUB_OFFLINE"] = "1"
    return env


def _env_file(ctx: RoleContext, inst: Instance) -> RenderedFile:
    content = ctx.render(
        "vllm.env.j2",
        unit=inst.unit,
        gpus=inst.gpus,
        side_channel_host=inst.side_channel_host,
        side_channel_port=inst.side_channel_port,
        extra_env=_hf_env(ctx, inst),
    )
    return RenderedFile(inst.env_file, content, mode="0600", secret=True)


def _unit_file(ctx: RoleContext, inst: Instance) -> RenderedFile:
    content = ctx.render(
        "vllm.service.j2",
        pool=inst.pool,
        model_id=ctx.profile.served_model(inst.model).model.id,
        service_user=SERVICE_USER,
        state_dir=STATE_DIR,
        env_file=inst.env_file,
        kv_env_file=KV_ENV_FILE,
        argv=serve_argv(ctx.profile, ctx.host, inst),
        start_timeout=VLLM_START_TIMEOUT_S,
    )
    return RenderedFile(inst.unit_path, content, mode="0644")


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return [instance_unit(inst) for inst in ctx.instances]


def files(ctx: RoleContext) -> list[RenderedFile]:
    out: list[RenderedFile] = []
    for inst in ctx.instances:
        out += [_env_file(ctx, inst), _unit_file(ctx, inst)]
    return out


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    yield retire(ctx)  # first: an old unit may hold the port a new one is about to start on
    for inst in ctx.instances:
        env = _env_file(ctx, inst)
        unit = _unit_file(ctx, inst)
        restart = instance_restart(inst)
        yield File(env.path, env.content.encode(), mode=env.mode, secret=True, notify=(restart,))
        yield SystemdUnit(inst.unit, unit.content.encode(), restart=restart)
        yield Service(
            inst.unit,
            enabled=True,
            running=True,
            health_url=inst.health_url,
            health_timeout=VLLM_START_TIMEOUT_S,
        )
