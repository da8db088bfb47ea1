"""Where a staged model's files come from and go: the revision's directory on the hosts, its files' URLs
on a mirror, and the manifest read on the control machine before anything is planned.

A mirror (an http(s) directory, or a directory on the control machine) holds `<id>/<revision>/` with the
files in the hub's layout and `manifest.json` (pdfleet.model.weights) beside them.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError as PydanticError

from pdfleet.errors import ValidationError
from pdfleet.fleet.host_layout import MODELS_DIR
from pdfleet.fleet.hub import hub_manifest, read_token, resolve_url
from pdfleet.model.specs import HUB, ModelSpec
from pdfleet.model.weights import MANIFEST_NAME, WeightsManifest

MANIFEST_TIMEOUT_S = 30.0


def model_root(model: ModelSpec) -> str:
    """The model's directory on the hosts: one directory per staged revision under it."""
    return f"{MODELS_DIR}/{model.id}"


def staged_dir(model: ModelSpec) -> str:
    """The revision's directory on the hosts (what a staged model's vLLM unit loads)."""
    return f"{model_root(model)}/{model.revision}"


def revision_url(model: ModelSpec) -> str:
    """The revision's directory on an http(s) mirror, ending in `/`."""
    assert model.source is not None and model.source.startswith(("http://", "https://"))
    quoted = urllib.parse.quote(f"{model.id}/{model.revision}")
    return f"{model.source.rstrip('/')}/{quoted}/"


def file_url(model: ModelSpec, path: str) -> str:
    """One file's URL: the hub's resolve URL, or on an http(s) mirror."""
    if model.source == HUB:
        return resolve_url(model, path)
    return revision_url(model) + urllib.parse.quote(path)


def _parse(text: str, where: str, model: ModelSpec) -> WeightsManifest:
    """A manifest that is well formed and is the one the profile pins."""
    try:
        manifest = WeightsManifest.model_validate_json(text)
    except PydanticError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ValidationError(f"{where}: not a weights manifest: {loc}: {first['msg']}") from None
    if (manifest.model, manifest.revision) != (model.id, model.revision):
        raise ValidationError(
            f"{where}: is the manifest of {manifest.model} at {manifest.revision}, not of {model.id} at "
            f"{model.revision} (model.id, model.revision)"
        )
    return manifest


def load_manifest(model: ModelSpec) -> WeightsManifest:
    """The pinned revision's manifest from the model's mirror (ValidationError naming the URL or path)."""
    source = model.source
    if source is None or source == HUB:
        raise ValidationError(f"model.source: {source!r} has no mirror manifest")
    if source.startswith(("http://", "https://")):
        url = revision_url(model) + MANIFEST_NAME
        try:
            with urllib.request.urlopen(url, timeout=MANIFEST_TIMEOUT_S) as resp:  # noqa: S310 (http(s) only)
                text = resp.read().decode()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ValidationError(f"model.source: cannot read {url}: {reason}") from None
        return _parse(text, url, model)
    path = Path(source, model.id, str(model.revision), MANIFEST_NAME)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValidationError(f"model.source: cannot read {path}: {exc.strerror}") from None
    return _parse(text, str(path), model)


def local_file(model: ModelSpec, path: str) -> Path:
    """A file of the revision in a control-machine mirror directory (manifest paths stay inside it)."""
    assert model.source is not None and model.source.startswith("/")
    return Path(model.source, model.id, str(model.revision), path)


def _check_local_files(model: ModelSpec, manifest: WeightsManifest) -> None:
    """Every file a control-machine mirror's manifest lists is there with its size: refused before any host
    is touched, naming the first few that are not."""
    wrong = []
    for f in manifest.files:
        path = local_file(model, f.path)
        try:
            size = path.stat().st_size
        except OSError:
            wrong.append(f"{path} is missing")
            continue
        if size != f.size:
            wrong.append(f"{path} holds {size} bytes, the manifest says {f.size}")
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        raise ValidationError(f"model.source: {'; '.join(wrong[:3])}{more}")


def load_manifests(models: Iterable[ModelSpec]) -> dict[str, WeightsManifest]:
    """Each staged model's manifest by model id (read once per id; from the hub with its token); a
    control-machine mirror must hold every file it lists, with its size."""
    found: dict[str, WeightsManifest] = {}
    for model in models:
        if not model.staged or model.id in found:
            continue
        if model.source == HUB:
            found[model.id] = hub_manifest(model, read_token(model))
            continue
        manifest = load_manifest(model)
        if model.source is not None and model.source.startswith("/"):
            _check_local_files(model, manifest)
        found[model.id] = manifest
    return found


def load_tokens(models: Iterable[ModelSpec]) -> dict[str, str]:
    """The hub token of each staged hub model that names one, by model id (read on the control machine)."""
    found: dict[str, str] = {}
    for model in models:
        if model.staged and model.source == HUB and model.id not in found:
            token = read_token(model)
            if token is not None:
                found[model.id] = token
    return found
