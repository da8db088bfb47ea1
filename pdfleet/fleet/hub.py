"""Staging from the Hugging Face hub through its documented HTTP API, and the hub token as a secret.

The control machine asks `GET {endpoint}/api/models/{id}/revision/{revision}?blobs=true` for the pinned
revision's files (siblings, with each LFS file's size and SHA-256), keeps the files vLLM reads (top-level
safetensors and their index, JSON configs, tokenizer files; not `original/` checkpoints), and hashes the
small non-LFS ones itself from `{endpoint}/{id}/resolve/{revision}/{path}` (the API gives only their git
blob id): the result is the same manifest a mirror serves. Hosts then fetch each file from that resolve URL
with the token in a 0600 header file (roles/weights), never on a command line.

The token is read here, on the control machine, from the file or environment variable the profile names
(model.token); it is never printed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.fleet.secrets import existing_key
from pdfleet.model.specs import ModelSpec
from pdfleet.model.weights import ManifestFile, WeightsManifest

DEFAULT_ENDPOINT = "https://huggingface.co"
HUB_TIMEOUT_S = 60.0
# the files vLLM reads from a hub repository: top-level weights, their index, configs and tokenizer files
SERVED_FILES = re.compile(r"^[^/]+\.(safetensors|json|model|tiktoken)$|^(merges|vocab)\.txt$")


TOKEN_CHARS = re.compile(r"[\x21-\x7e]+")  # a bearer token's characters (RFC 6750 allows fewer)


def endpoint(model: ModelSpec) -> str:
    """The hub's base URL (model.hub_endpoint, else the public hub), without a trailing slash."""
    return (model.hub_endpoint or DEFAULT_ENDPOINT).rstrip("/")


def resolve_url(model: ModelSpec, path: str) -> str:
    """A file of the pinned revision as the hub serves it."""
    quoted = urllib.parse.quote(f"{model.id}/resolve/{model.revision}/{path}")
    return f"{endpoint(model)}/{quoted}"


def read_token(model: ModelSpec) -> str | None:
    """The hub token from model.token's file (owner-only, like the gateway's keys) or variable; None when
    the profile names none. Errors name the file or variable, never the value."""
    source = model.token
    if source is None:
        return None
    if source.env is not None:
        value = os.environ.get(source.env, "").strip()
        if not value:
            raise ValidationError(f"model.token.env: the environment variable {source.env} is unset or empty")
        return _one_header_value(value, f"model.token.env: the environment variable {source.env}")
    assert source.file is not None
    file = Path(source.file).expanduser()
    kept = existing_key(file)
    if kept is None:
        raise ValidationError(f"model.token.file: {file} does not exist (put the hub token there, mode 0600)")
    return _one_header_value(kept, f"model.token.file: {file}")


def _one_header_value(token: str, where: str) -> str:
    """The token as it goes into one `Authorization` line: visible ASCII only, so no value can end the
    line and add another to the headers file (or make urllib fail with a traceback). Never shown."""
    if not TOKEN_CHARS.fullmatch(token):
        raise ValidationError(f"{where} holds a space, line break or non-ASCII character: not a hub token")
    return token


def _get(url: str, token: str | None) -> bytes:
    """GET with the token as a bearer header (never in the URL); a failure names the URL and status."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=HUB_TIMEOUT_S) as resp:  # noqa: S310 (http(s) only)
            return bytes(resp.read())
    except urllib.error.HTTPError as exc:
        hint = " (gated or private: set model.token)" if exc.code in (401, 403) and not token else ""
        raise ValidationError(f"model.source: hub: {url}: HTTP {exc.code}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ValidationError(f"model.source: hub: {url}: {getattr(exc, 'reason', exc)}") from None


def _sibling(model: ModelSpec, entry: Any, token: str | None) -> ManifestFile | None:
    """One file of the revision's listing as a manifest entry (None: vLLM does not read it)."""
    path = entry.get("rfilename") if isinstance(entry, dict) else None
    if not isinstance(path, str) or not SERVED_FILES.match(path):
        return None
    lfs = entry.get("lfs")
    if isinstance(lfs, dict) and isinstance(lfs.get("sha256"), str):
        return ManifestFile(path=path, size=int(lfs["size"]), sha256=lfs["sha256"])
    data = _get(resolve_url(model, path), token)  # a small git file: the API has no SHA-256 of it
    return ManifestFile(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def hub_manifest(model: ModelSpec, token: str | None) -> WeightsManifest:
    """The pinned revision's manifest from the hub's API (see the module docstring)."""
    quoted = urllib.parse.quote(f"{model.id}/revision/{model.revision}")
    url = f"{endpoint(model)}/api/models/{quoted}?blobs=true"
    try:
        info = json.loads(_get(url, token))
    except ValueError:
        raise ValidationError(f"model.source: hub: {url}: not JSON") from None
    siblings = info.get("siblings") if isinstance(info, dict) else None
    if not isinstance(siblings, list):
        raise ValidationError(f"model.source: hub: {url}: no file listing (siblings)")
    files = [f for f in (_sibling(model, s, token) for s in siblings) if f is not None]
    if not files:
        raise ValidationError(f"model.source: hub: {model.id} at {model.revision} has no file vLLM reads")
    return WeightsManifest(model=model.id, revision=str(model.revision), files=tuple(files))
