"""The gateway host's copy of a model's tokenizer (gateway.decider.tokenizer: staged, issue 32).

The tokenizer the gateway runs must be the one the engines run, byte for byte: a different merge or chat
template gives other ids, hence other KV-event blocks, and every text prompt would read as uncached. So it
comes from the model's staged revision (model.source at model.revision), not from the hub's default branch
or a file an operator copied: the tokenizer files of that revision's manifest (TOKENIZER_FILES), checked by
SHA-256, copied to the gateway host's staged directory of the revision by the same operations that stage the
whole revision on its pool hosts (roles/weights). A gateway host that serves the model already has them.
"""

from __future__ import annotations

from collections.abc import Iterable

from pdfleet.errors import ValidationError
from pdfleet.fleet.roles import RoleContext
from pdfleet.model.served import ServedModel
from pdfleet.model.weights import WeightsManifest
from pdfleet.ops.base import Handler, Operation
from roles.weights import stage_operations

# what the gateway reads of a model's tokenizer directory (pdfleet.gateway.prompt_ids and
# pdfleet.chat_template): the tokenizer, its config (the chat template and special tokens) and a template
# file beside it
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def tokenizer_models(ctx: RoleContext) -> list[ServedModel]:
    """The models whose gateway runs the staged revision's tokenizer (gateway.decider.tokenizer: staged)."""
    return [spec for spec in ctx.profile.served if spec.gateway.decider.tokenizer == "staged"]


def tokenizer_manifest(ctx: RoleContext, spec: ServedModel) -> WeightsManifest:
    """The part of the model's staged revision the gateway reads (ValidationError when it has no
    tokenizer.json: nothing to count with)."""
    manifest = ctx.manifest(spec.model)
    files = [f for f in manifest.files if f.path in TOKENIZER_FILES]
    if not any(f.path == TOKENIZER_FILES[0] for f in files):
        raise ValidationError(
            f"{spec.key('gateway.decider.tokenizer')}: staged, but {spec.model.id} at {spec.model.revision} "
            f"has no {TOKENIZER_FILES[0]} in its manifest; use estimate"
        )
    return manifest.model_copy(update={"files": files})


def tokenizer_operations(ctx: RoleContext, notify: tuple[Handler, ...]) -> Iterable[Operation]:
    """Each tokenizing model's files on this gateway host (unless it serves the model: the weights role
    stages the whole revision there); `notify` (the gateway's reload) when one changed."""
    served_here = {ctx.profile.served_model(inst.model).model.id for inst in ctx.instances}
    for spec in tokenizer_models(ctx):
        if spec.model.id not in served_here:
            yield from stage_operations(ctx, spec.model, tokenizer_manifest(ctx, spec), notify)
