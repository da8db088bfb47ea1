"""A revision's manifest (issue 31): every file with its size and SHA-256, paths that stay inside the
revision's directory, one entry per path, and the manifest a directory hashes to."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pydantic import ValidationError

from pdfleet.model.weights import ManifestFile, WeightsManifest, manifest_of_dir

SHA = "0" * 64


def test_a_directory_hashes_to_its_manifest(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "config.json").write_text("{}\n")
    (tmp_path / "sub" / "w.safetensors").write_bytes(b"x" * 10)
    (tmp_path / "manifest.json").write_text("old")  # never lists itself
    manifest = manifest_of_dir(tmp_path, "org/m", "r1")
    assert [(f.path, f.size) for f in manifest.files] == [("config.json", 3), ("sub/w.safetensors", 10)]
    assert manifest.files[1].sha256 == hashlib.sha256(b"x" * 10).hexdigest()
    assert manifest.total_bytes == 13
    assert WeightsManifest.model_validate_json(manifest.to_json()) == manifest
    (tmp_path / "config.json").write_text("{ }\n")
    assert manifest_of_dir(tmp_path, "org/m", "r1").digest() != manifest.digest()


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../../x", "a//b", "x.part", "it's", "", "a\nb"])
def test_a_path_outside_the_directory_or_unquotable_is_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="must be a plain relative path"):
        ManifestFile(path=path, size=1, sha256=SHA)


def test_a_manifest_lists_each_path_once_and_at_least_one() -> None:
    one = ManifestFile(path="a", size=1, sha256=SHA)
    with pytest.raises(ValidationError, match="files: lists a more than once"):
        WeightsManifest(model="m", revision="r", files=(one, one))
    with pytest.raises(ValidationError):
        WeightsManifest(model="m", revision="r", files=())
    with pytest.raises(ValidationError):
        ManifestFile(path="a", size=1, sha256="ABC")
