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


def staged_dir(model: ModelSpec) -> str:
    """The revision's directory on the hosts (what a staged model's vLLM unit loads)."""
    return f"{MODELS_DIR}/{model.id}/{model.revision}"


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


def stageable(model: ModelSpec) -> str | None:
    """Why provision cannot stage this model's source yet (None: it can): it copies from an http(s) mirror
    or the hub; pushing a control-machine directory to the hosts is still to come."""
    source = model.source
    if source is not None and source != HUB and not source.startswith(("http://", "https://")):
        return (
            f"pushing {source} from the control machine is not built yet; serve it over http(s) "
            f"(e.g. python3 -m http.server --directory {source}) and name that URL"
        )
    return None


def load_manifests(models: Iterable[ModelSpec]) -> dict[str, WeightsManifest]:
    """Each staged model's manifest by model id (read once per id; from the hub with its token); a source
    provision cannot stage yet is refused here, before any host is touched."""
    found: dict[str, WeightsManifest] = {}
    for model in models:
        if not model.staged or model.id in found:
            continue
        why = stageable(model)
        if why is not None:
            raise ValidationError(f"model.source: {why}")
        found[model.id] = (
            hub_manifest(model, read_token(model)) if model.source == HUB else load_manifest(model)
        )
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
