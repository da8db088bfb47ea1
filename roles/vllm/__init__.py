"""vllm: a venv holding the pinned vLLM, or for `engine: sim` the pdfleet wheel (the simulator), with the
tokenizer extra (tokenizers, jinja2) where a model it serves has the gateway run the staged tokenizer
(gateway.decider.tokenizer: staged): the simulator then prefills the rendered chat ids the gateway hashes,
as vLLM does (vLLM brings its own)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.host_wheel import TOKENIZER_EXTRA, extra_requirements
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
        models = {inst.model for inst in ctx.instances}
        tokenizes = any(ctx.profile.served_model(m).gateway.decider.tokenizer == "staged" for m in models)
        also = extra_requirements(TOKENIZER_EXTRA) if tokenizes else ()
        return (f"pdfleet=={ctx.host_version}", *also)
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
