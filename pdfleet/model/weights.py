"""A model revision's manifest: every file vLLM reads (safetensors and their index, config, tokenizer
files) with its size and SHA-256, as a site mirror serves it beside the files (`manifest.json`).

Staging (roles/weights) copies exactly these files and checks each against its SHA-256; `invoke verify`
and `invoke doctor --profile` compare a host's files with it. Pure: no I/O but `manifest_of_dir`, which
hashes a local directory to make one (for a mirror, and for the lab's model).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, model_validator

from pdfleet.model.specs import StrictModel

MANIFEST_NAME = "manifest.json"
CHUNK = 1 << 20


def _relative_path(value: str) -> str:
    """A file's path inside the revision's directory: relative, normalised, no `..` (it is joined to the
    staged directory on the hosts and to the mirror's URL)."""
    if (
        not value
        or value.startswith("/")
        or posixpath.normpath(value) != value
        or value.split("/", 1)[0] == ".."
        or any(c in value for c in "\n\\'\"$`")
        or value.endswith(".part")
    ):
        raise ValueError(
            f"must be a plain relative path like model-00001-of-00002.safetensors (got {value!r})"
        )
    return value


class ManifestFile(StrictModel):
    """One file of the revision: where it sits in the directory, its size and its SHA-256."""

    path: Annotated[str, AfterValidator(_relative_path)]
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class WeightsManifest(StrictModel):
    """The files of one model revision (see the module docstring)."""

    model: str = Field(min_length=1)
    revision: str = Field(min_length=1)
    files: tuple[ManifestFile, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_entry_per_path(self) -> WeightsManifest:
        paths = [f.path for f in self.files]
        twice = sorted({p for p in paths if paths.count(p) > 1})
        if twice:
            raise ValueError(f"files: lists {', '.join(twice)} more than once")
        return self

    @property
    def total_bytes(self) -> int:
        """What a host stores once staged."""
        return sum(f.size for f in self.files)

    def digest(self) -> str:
        """A short fingerprint of the exact file set (paths, sizes, checksums): two hosts with the same
        digest staged the same bytes."""
        text = json.dumps([[f.path, f.size, f.sha256] for f in sorted(self.files, key=lambda f: f.path)])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=1) + "\n"


def file_sha256(path: Path) -> str:
    """A file's SHA-256, read in 1 MiB chunks (weights do not fit in memory)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_of_dir(directory: Path, model: str, revision: str) -> WeightsManifest:
    """The manifest of every regular file under `directory` (but a manifest.json), sorted by path."""
    files = [
        ManifestFile(path=p.relative_to(directory).as_posix(), size=p.stat().st_size, sha256=file_sha256(p))
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.relative_to(directory).as_posix() != MANIFEST_NAME
    ]
    return WeightsManifest(model=model, revision=revision, files=tuple(files))
