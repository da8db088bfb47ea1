"""Reading a staged model's manifest on the control machine (issue 31): from an http(s) mirror or a
directory, refused naming the URL or path when unreadable, malformed, or another revision's, or (a
directory pushed to the hosts) when a file it lists is missing or another size."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.weights import file_url, load_manifest, load_manifests, local_file, staged_dir
from pdfleet.lab.model_mirror import LAB_MODEL, build_lab_models, make_server
from pdfleet.model.specs import ModelSpec


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("mirror")
    build_lab_models(root)
    server = make_server("127.0.0.1", 0, root)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root
    finally:
        server.shutdown()
        server.server_close()


def _model(source: str, revision: str = "lab-r1") -> ModelSpec:
    return ModelSpec(id=LAB_MODEL, source=source, revision=revision)


def test_the_manifest_comes_from_the_mirror_or_a_directory(served: tuple[str, Path]) -> None:
    url, root = served
    over_http = load_manifest(_model(url))
    assert over_http == load_manifest(_model(str(root)))
    assert over_http.revision == "lab-r1" and len(over_http.files) == 8
    assert load_manifest(_model(url, "lab-r2")).digest() != over_http.digest()
    assert load_manifests([_model(url), _model(url), ModelSpec(id="other/m")]) == {LAB_MODEL: over_http}
    assert staged_dir(_model(url)) == f"/var/lib/pdfleet/models/{LAB_MODEL}/lab-r1"
    assert file_url(_model(url), "a b.json") == f"{url}{LAB_MODEL}/lab-r1/a%20b.json"


def test_unreadable_malformed_or_other_manifests_are_refused(served: tuple[str, Path]) -> None:
    url, root = served
    with pytest.raises(
        ValidationError, match=rf"model.source: cannot read {url}{LAB_MODEL}/nope/manifest.json: "
    ):
        load_manifest(_model(url, "nope"))
    with pytest.raises(
        ValidationError, match=rf"model.source: cannot read {root}/{LAB_MODEL}/nope/manifest.json"
    ):
        load_manifest(_model(str(root), "nope"))
    bad = root / LAB_MODEL / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text('{"model": "x", "revision": "bad", "files": [{"path": "../x"}]}')
    with pytest.raises(ValidationError, match=r"manifest.json: not a weights manifest: files.0.path: "):
        load_manifest(_model(str(root), "bad"))
    (root / LAB_MODEL / "lab-r1" / "manifest.json").replace(bad / "manifest.json")
    try:
        with pytest.raises(
            ValidationError, match=f"is the manifest of {LAB_MODEL} at lab-r1, not of {LAB_MODEL} at bad"
        ):
            load_manifest(_model(url, "bad"))
    finally:
        (bad / "manifest.json").replace(root / LAB_MODEL / "lab-r1" / "manifest.json")


def test_a_control_machine_directory_must_hold_every_file_with_its_size(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Its files are pushed to the hosts, so a missing or resized one is refused before any host."""
    root = tmp_path_factory.mktemp("pushed")
    manifest = build_lab_models(root)[0]
    assert load_manifests([_model(str(root))]) == {LAB_MODEL: manifest}
    shard, config = (root / LAB_MODEL / "lab-r1" / f.path for f in manifest.files[:2])
    assert local_file(_model(str(root)), manifest.files[0].path) == shard
    shard.unlink()
    config.write_text("{}")
    with pytest.raises(ValidationError, match=rf"model.source: {shard} is missing; {config} holds 2 bytes"):
        load_manifests([_model(str(root))])
