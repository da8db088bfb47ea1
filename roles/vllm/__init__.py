"""vllm: a venv holding the pinned vLLM, or for `engine: sim` the pdfleet wheel (the simulator)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, instance_restart
from pdfleet.ops.base import Fact, FactSource, Operation, Skip
from pdfleet.ops.files import Directory
from pdfleet.ops.pip import PipRequirements

NAME = "vllm"
APT_PACKAGES: tuple[str, ...] = ()


def applies(ctx: RoleContext) -> bool:
    return bool(ctx.instances)


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    return ()  # its operations() reads no fact


def files(ctx: RoleContext) -> list[RenderedFile]:
    return []


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return []


def requirements(ctx: RoleContext) -> tuple[str, ...]:
    """The pinned server package for this profile's engine."""
    vllm = ctx.profile.vllm
    if vllm.engine == "sim":
        return (f"pdfleet=={ctx.host_version}",)
    return (f"vllm=={vllm.version}",)


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    venv = ctx.profile.vllm.venv.rstrip("/")
    parent = venv.rsplit("/", 1)[0] or "/"
    mirrors = ctx.profile.mirrors
    yield Directory(parent, mode="0755", owner="root", group="root")
    yield PipRequirements(
        venv,
        requirements(ctx),
        index_url=mirrors.pypi,
        trusted_host=mirrors.pypi_trusted_host,
        notify=tuple(instance_restart(inst) for inst in ctx.instances),
    )
