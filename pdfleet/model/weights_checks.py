"""The profile checks of staged weights (issue 31): a staged model pins a path-safe revision, a token only
for the hub; one model id is served at one revision; a model's prefill and decode pools load the same
weights the same way; and the warning about a vLLM model whose revision floats."""

from __future__ import annotations

import re
from collections.abc import Iterable

from pdfleet.model.problems import Problem
from pdfleet.model.profile import Profile
from pdfleet.model.served import ServedModel
from pdfleet.model.specs import HUB

# A revision a staged model names becomes a directory on the hosts and a segment of the mirror's URL.
STAGED_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# extra_args options that change which weights or tokenizer an instance loads, or how it reads them: a
# prefill and a decode instance differing in one exchange KV caches that do not belong together.
WEIGHTS_FLAGS = (
    "--tokenizer",
    "--tokenizer-revision",
    "--code-revision",
    "--load-format",
    "--quantization",
    "-q",
    "--dtype",
    "--hf-overrides",
)


def weights_problems(spec: ServedModel) -> Iterable[Problem]:
    """A staged model names exactly what it stages: a path-safe revision, a token only from the hub."""
    model = spec.model
    if model.source is None:
        for key in ("token", "bandwidth_limit", "hub_endpoint"):
            if getattr(model, key) is not None:
                yield Problem(
                    spec.key(f"model.{key}"), "applies to staged weights only; set model.source too"
                )
        return
    if model.revision is None:
        yield Problem(
            spec.key("model.revision"),
            f"source {model.source!r} stages a pinned revision; set the hub's commit hash or the mirror's "
            "version id",
        )
    elif not STAGED_REVISION.match(model.revision):
        yield Problem(
            spec.key("model.revision"),
            "a staged revision names a directory on the hosts: letters, digits, '.', '_' and '-' "
            f"(got {model.revision!r})",
        )
    if model.hub_endpoint is not None and (
        model.source != HUB or not model.hub_endpoint.startswith(("http://", "https://"))
    ):
        yield Problem(
            spec.key("model.hub_endpoint"),
            f"is the hub's http(s) URL, for source 'hub' only (got {model.hub_endpoint!r}, "
            f"source {model.source!r})",
        )
    if model.token is not None and model.source != HUB:
        yield Problem(
            spec.key("model.token"), f"only source 'hub' downloads with a token (source is {model.source!r})"
        )
    if model.path is not None:
        yield Problem(
            spec.key("model.path"),
            "is where vLLM reads the weights; a staged model is read from its staged directory, so unset one "
            "of model.path and model.source",
        )


def _flag_values(args: list[str]) -> dict[str, list[str]]:
    """Of extra_args, each weights flag's values as written (`--dtype half` and `--dtype=half` alike)."""
    found: dict[str, list[str]] = {}
    for index, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in WEIGHTS_FLAGS:
            if not eq:
                value = args[index + 1] if index + 1 < len(args) else ""
            found.setdefault(flag, []).append(value)
    return found


def pd_weights_problems(spec: ServedModel) -> Iterable[Problem]:
    """A model's prefill and decode instances load the same weights the same way (llm-d refuses to pair P
    and D across revisions): extra_args may not set a weights option differently on one of them."""
    prefill, decode = spec.pools.prefill, spec.pools.decode
    if not spec.disaggregated or prefill is None or decode is None:
        return
    p_flags, d_flags = _flag_values(prefill.extra_args), _flag_values(decode.extra_args)
    for flag in sorted(set(p_flags) | set(d_flags)):
        if p_flags.get(flag) != d_flags.get(flag):
            yield Problem(
                spec.key("pools.decode.extra_args"),
                f"{flag} is {d_flags.get(flag) or 'unset'} on decode but {p_flags.get(flag) or 'unset'} on "
                "prefill: a decode instance must load the weights its prefill instance computed the KV cache "
                "with; set it on both pools or neither",
            )


def one_revision_per_model_id(profile: Profile) -> Iterable[Problem]:
    """Every pool serving one model id serves one revision from one source: two `models:` entries of the
    same id pinned differently would put two revisions of the "same" model behind the fleet."""
    first: dict[str, ServedModel] = {}
    for spec in profile.served:
        seen = first.setdefault(spec.model.id, spec)
        if seen is spec:
            continue
        for key in ("revision", "source"):
            if getattr(seen.model, key) != getattr(spec.model, key):
                yield Problem(
                    spec.key(f"model.{key}"),
                    f"{spec.model.id} is served at {key} {getattr(seen.model, key)!r} by "
                    f"{seen.key('model')} but {getattr(spec.model, key)!r} here: every pool of a model "
                    "serves one pinned revision",
                )


def weights_warnings(profile: Profile) -> list[Problem]:
    """What `invoke profiles` warns about without refusing: a vLLM model whose revision floats (each host
    loads whatever the hub's default branch holds when it starts, so hosts can differ)."""
    if profile.vllm.engine != "vllm":
        return []
    return [
        Problem(
            spec.key("model.revision"),
            f"unset: {spec.model.id} floats on the hub's default branch (hosts starting on different days "
            "can load different weights); pin the commit hash",
        )
        for spec in profile.served
        if spec.model.revision is None
    ]
