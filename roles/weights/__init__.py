"""weights: each staged model's pinned revision in its directory on every host that serves it, before the
vLLM units start (the services role runs after this one). Every file of the revision's manifest is checked
by SHA-256 (one batched sha256sum per revision: a converged host changes nothing and downloads nothing);
a missing, partial or corrupt file is fetched from the model's mirror (or pushed from the control
machine's directory over the host's SSH connection), resumed when partial, and checked
before it takes its name; a host whose disk cannot hold the missing files is refused before any download.
The instances serving the model restart when one of its files changed. From the hub, the token waits in a
0600 headers file (curl -H @file) only while files are fetched, then is removed. The model's other
revision directories go once the host converged and its instances run the pin (OldRevisions)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pdfleet.fleet.host_layout import CONFIG_DIR, MODELS_DIR
from pdfleet.fleet.render import RenderedFile
from pdfleet.fleet.roles import ManagedUnit, RoleContext, instance_restart
from pdfleet.fleet.weights import file_url, local_file, model_root, staged_dir
from pdfleet.model.specs import ModelSpec
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.base import Fact, FactSource, Handler, Operation, Skip
from pdfleet.ops.files import Directory
from pdfleet.ops.weights import (
    DownloadHeaders,
    HeadersRemoved,
    OldRevisions,
    PushFile,
    RevisionDirs,
    StagedFiles,
    StageFile,
    WeightsSpace,
)

NAME = "weights"
APT_PACKAGES: tuple[str, ...] = ()  # curl and coreutils: the base role's


def staged_models(ctx: RoleContext) -> list[ModelSpec]:
    """The staged models this host serves, one per model id (the profile checks pin one revision per id)."""
    found: dict[str, ModelSpec] = {}
    for inst in ctx.instances:
        model = ctx.profile.served_model(inst.model).model
        if model.staged:
            found.setdefault(model.id, model)
    return list(found.values())


def applies(ctx: RoleContext) -> bool:
    return bool(staged_models(ctx))


def facts(ctx: RoleContext) -> tuple[Fact[Any], ...]:
    found: list[Fact[Any]] = []
    for model in staged_models(ctx):
        found.append(StagedFiles(staged_dir(model), tuple(f.path for f in ctx.manifest(model).files)))
        if "/" in model.id:
            found.append(RevisionDirs(model_root(model)))
    return tuple(found)


def files(ctx: RoleContext) -> list[RenderedFile]:
    return []


def units(ctx: RoleContext) -> list[ManagedUnit]:
    return []


def operations(ctx: RoleContext, facts: FactSource) -> Iterable[Operation | Skip]:
    for model in staged_models(ctx):
        restarts = tuple(
            instance_restart(inst)
            for inst in ctx.instances
            if ctx.profile.served_model(inst.model).model.id == model.id
        )
        yield from stage_operations(ctx, model, ctx.manifest(model), restarts)
        if "/" in model.id:  # MODELS_DIR/<owner> of an id without one may hold other owners' models
            yield OldRevisions(model_root(model), str(model.revision), restarts)


def stage_operations(
    ctx: RoleContext, model: ModelSpec, manifest: WeightsManifest, notify: tuple[Handler, ...]
) -> Iterable[Operation]:
    """The files of `manifest` (a revision's, or a part of it: the gateway's tokenizer files) in the model's
    staged directory, checked by SHA-256, from its mirror, the control machine or the hub; `notify` runs
    when one changed."""
    directory = staged_dir(model)
    paths = tuple(f.path for f in manifest.files)
    yield WeightsSpace(directory, manifest)  # first: refuses the host before the directory is made
    yield Directory(MODELS_DIR, mode="0755")
    yield Directory(directory, mode="0755")
    token = ctx.hub_tokens.get(model.id)
    headers = headers_file(model) if token is not None else None
    if headers is not None and token is not None:
        content = f"Authorization: Bearer {token}\n".encode()
        yield DownloadHeaders(headers, content, directory, paths, manifest)
    pushed = model.source is not None and model.source.startswith("/")
    for file in manifest.files:
        if pushed:  # from the control machine, over the host's SSH connection
            source = str(local_file(model, file.path))
            yield PushFile(directory, file, source, paths, limit=model.bandwidth_limit, notify=notify)
            continue
        yield StageFile(
            directory,
            file,
            file_url(model, file.path),
            paths,
            limit=model.bandwidth_limit,
            header_file=headers,
            notify=notify,
        )
    if headers is not None:
        yield HeadersRemoved(headers, directory, paths, manifest)


def headers_file(model: ModelSpec) -> str:
    """Where a hub model's token waits (0600, root) while its files download: not the units' env files, so
    no unit ever carries it."""
    return f"{CONFIG_DIR}/weights-{re.sub(r'[^A-Za-z0-9.-]+', '-', model.id)}.headers"
