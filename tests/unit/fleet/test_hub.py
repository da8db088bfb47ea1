"""Staging from the hub (issue 31), only ever against a local stand-in for the hub's HTTP API on loopback:
the revision's listing becomes the manifest (LFS files by their SHA-256, small git files hashed here, files
vLLM does not read left out), a gated repository without a token is a clear error, hosts fetch with the
token from a 0600 headers file, and a token-shaped value appears in no unit, env file, render output,
command line, diff or progress line; only in the 0600 upload, which is written only while files are
missing and removed after."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.deployment import DeploymentRequest, load_deployment
from pdfleet.fleet.hub import hub_manifest, read_token
from pdfleet.fleet.provision import render_fleet
from pdfleet.fleet.weights import file_url, load_manifests, load_tokens, model_root, staged_dir
from pdfleet.lab.model_mirror import LAB_MODEL, lab_model_files
from pdfleet.model.specs import ModelSpec, TokenSource
from pdfleet.ops.base import FakeFacts, Run, Upload
from pdfleet.ops.files import DirectoryState, FileState
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.runner import CommandError, execute
from pdfleet.ops.ssh import LocalTransport
from pdfleet.ops.weights import (
    DownloadHeaders,
    HeadersRemoved,
    RevisionDirs,
    RevisionUse,
    StagedFiles,
    StagedState,
    StageFile,
)
from roles import REGISTRY, weights
from tests.unit.fleet.helpers import REPO

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

TOKEN = "hf_" + "Tq3xZ8kLmN2pQrStUvWxYz0aBcDeFgHiJk"  # token-shaped, not a real one
REVISION = "0123456789abcdef0123456789abcdef01234567"
FILES = lab_model_files("hub") | {"README.md": b"# readme\n", "original/consolidated.00.pth": b"pth" * 10}
LFS = {p for p in FILES if p.endswith((".safetensors", ".pth"))}


class StandIn(BaseHTTPRequestHandler):
    """The hub's two documented endpoints for one gated repository: the revision's listing and resolve
    (LFS files answered with a redirect, as the hub sends them to its CDN)."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._send(401, b'{"error": "Access to model is restricted"}')
            return
        listing = f"/api/models/{LAB_MODEL}/revision/{REVISION}?blobs=true"
        resolve = f"/{LAB_MODEL}/resolve/{REVISION}/"
        if self.path == listing:
            siblings: list[dict[str, Any]] = []
            for path, data in FILES.items():
                entry: dict[str, Any] = {"rfilename": path, "size": len(data), "blobId": "0" * 40}
                if path in LFS:
                    entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                siblings.append(entry)
            self._send(200, json.dumps({"id": LAB_MODEL, "sha": REVISION, "siblings": siblings}).encode())
        elif self.path.startswith(resolve) and self.path[len(resolve) :] in LFS:
            self.send_response(302)
            self.send_header("Location", "/cdn/" + self.path[len(resolve) :])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path.startswith(resolve) and self.path[len(resolve) :] in FILES:
            self._send(200, FILES[self.path[len(resolve) :]])
        elif self.path.startswith("/cdn/") and self.path[5:] in LFS:
            self._send(200, FILES[self.path[5:]])
        else:
            self._send(404, b"{}")

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _model(hub: str, token: TokenSource | None) -> ModelSpec:
    return ModelSpec(id=LAB_MODEL, source="hub", revision=REVISION, hub_endpoint=hub, token=token)


def test_the_listing_becomes_the_manifest_of_the_files_vllm_reads(hub: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_TOKEN_TEST", TOKEN)
    manifest = hub_manifest(_model(hub, None), read_token(_model(hub, TokenSource(env="HF_TOKEN_TEST"))))
    want = {
        p: hashlib.sha256(d).hexdigest()
        for p, d in FILES.items()
        if p not in ("README.md", "original/consolidated.00.pth")
    }
    assert {f.path: f.sha256 for f in manifest.files} == want
    with pytest.raises(ValidationError, match=r"HTTP 401 \(gated or private: set model.token\)"):
        hub_manifest(_model(hub, None), None)
    monkeypatch.setenv("HF_TOKEN_TEST", "")
    with pytest.raises(
        ValidationError, match="model.token.env: the environment variable HF_TOKEN_TEST is unset or empty"
    ):
        read_token(_model(hub, TokenSource(env="HF_TOKEN_TEST")))


def test_a_token_file_must_be_the_owner_s_only(tmp_path: Path, hub: str) -> None:
    file = tmp_path / "hf-token"
    file.write_text(TOKEN + "\n")
    file.chmod(0o644)
    with pytest.raises(ValidationError, match="readable by its owner only") as err:
        read_token(_model(hub, TokenSource(file=str(file))))
    assert TOKEN not in str(err.value)
    file.chmod(0o600)
    assert read_token(_model(hub, TokenSource(file=str(file)))) == TOKEN
    with pytest.raises(ValidationError, match="model.token.file: .* does not exist"):
        read_token(_model(hub, TokenSource(file=str(tmp_path / "none"))))


@pytest.mark.parametrize("bad", [TOKEN + "\nX-Injected: 1", TOKEN[:4] + " " + TOKEN[4:], TOKEN + "\u00e9"])
def test_a_token_that_could_add_a_header_line_is_refused_without_showing_it(  # type: ignore[no-untyped-def]
    bad: str, hub: str, monkeypatch
) -> None:
    monkeypatch.setenv("HF_TOKEN_TEST", bad)
    with pytest.raises(ValidationError, match="HF_TOKEN_TEST holds a space, line break") as err:
        read_token(_model(hub, TokenSource(env="HF_TOKEN_TEST")))
    assert TOKEN[:8] not in str(err.value)


def test_hosts_fetch_from_the_hub_with_the_headers_file(hub: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The real curl against the stand-in, LFS redirects included; no command line holds the token."""
    monkeypatch.setenv("HF_TOKEN_TEST", TOKEN)
    model = _model(hub, TokenSource(env="HF_TOKEN_TEST"))
    manifest = load_manifests([model])[LAB_MODEL]
    headers = tmp_path / "h"
    headers.write_text(f"Authorization: Bearer {TOKEN}\n")
    headers.chmod(0o600)
    directory = tmp_path / "staged"
    directory.mkdir()
    paths = tuple(f.path for f in manifest.files)
    ops = [
        StageFile(str(directory), f, file_url(model, f.path), paths, header_file=str(headers))
        for f in manifest.files
    ]
    facts = HostFacts(LocalTransport())
    for change in [c for op in ops for c in op.plan(facts)]:
        for cmd in change.commands:
            assert isinstance(cmd, Run) and TOKEN not in cmd.cmd
            execute(LocalTransport(), cmd, timeout=60)
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()} == {
        f.path: f.sha256 for f in manifest.files
    }


def test_a_failed_hub_download_removes_the_headers_file(hub: str, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """HeadersRemoved comes after the downloads and never runs once one fails: the failing command itself
    removes the token's file (a 404, then a token the hub refuses); a download that works keeps it."""
    monkeypatch.setenv("HF_TOKEN_TEST", TOKEN)
    model = _model(hub, TokenSource(env="HF_TOKEN_TEST"))
    manifest = load_manifests([model])[LAB_MODEL]
    config = next(f for f in manifest.files if f.path == "config.json")
    headers = tmp_path / "h"
    directory = tmp_path / "staged"
    directory.mkdir()

    def stage(url: str, token: str) -> None:
        headers.write_text(f"Authorization: Bearer {token}\n")
        headers.chmod(0o600)
        execute(
            LocalTransport(),
            StageFile(str(directory), config, url, (), header_file=str(headers))
            .plan(FakeFacts({StagedFiles(str(directory), ()): StagedState({}, {}, 1 << 30)}))[0]
            .commands[0],
            timeout=60,
        )

    for url, token in (
        (f"{file_url(model, config.path)}-missing", TOKEN),
        (file_url(model, config.path), "x"),
    ):
        with pytest.raises(CommandError, match="the hub token's headers file was removed") as err:
            stage(url, token)
        assert not headers.exists() and TOKEN not in str(err.value)
    stage(file_url(model, config.path), TOKEN)
    assert (
        headers.exists()
        and hashlib.sha256((directory / "config.json").read_bytes()).hexdigest() == config.sha256
    )


def test_a_token_shaped_value_is_in_no_unit_env_render_command_or_diff(
    hub: str, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HF_TOKEN_TEST", TOKEN)
    for name in ("_base", "cross-rdma", "lab-cross"):
        (tmp_path / f"{name}.yml").write_text((REPO / "profiles" / f"{name}.yml").read_text())
    (tmp_path / "hub.yml").write_text(
        f"extends: lab-cross\nmodel: {{source: hub, revision: {REVISION}, hub_endpoint: '{hub}', "
        "token: {env: HF_TOKEN_TEST}}\n"
    )
    request = DeploymentRequest(
        "hub",
        REPO / "inventory/lab.yml",
        tmp_path,
        REPO / "templates",
        REGISTRY,
        manifests=load_manifests,
        hub_tokens=load_tokens,
    )
    fleet = load_deployment(request)
    assert TOKEN not in repr(fleet) and TOKEN not in repr(fleet.context(fleet.hosts[0]))
    rendered = render_fleet(fleet, fleet.hosts)
    assert rendered and not [f.path for files in rendered.values() for f in files if TOKEN in f.content]
    d1 = fleet.context(fleet.inventory.hosts["lab-d1"])
    directory = staged_dir(d1.profile.model)
    manifest = d1.manifest(d1.profile.model)
    paths = tuple(f.path for f in manifest.files)
    ops = list(weights.operations(d1, FakeFacts({})))
    headers = next(op for op in ops if isinstance(op, DownloadHeaders))
    missing = FakeFacts(
        {
            StagedFiles(directory, paths): StagedState({}, {}, 1 << 40),
            FileState(headers.path): None,
            DirectoryState("/var/lib/pdfleet/models"): None,
            DirectoryState(directory): None,
            RevisionDirs(model_root(d1.profile.model)): RevisionUse({}, {}),
        }
    )
    uploads = []
    for op in ops:
        assert TOKEN not in op.describe()  # the runner's progress lines
        for change in op.plan(missing):
            assert TOKEN not in change.diff
            for cmd in change.commands:
                if isinstance(cmd, Upload):
                    uploads.append(cmd)
                else:
                    assert TOKEN not in cmd.cmd
    (upload,) = uploads
    assert upload.content == f"Authorization: Bearer {TOKEN}\n".encode() and upload.mode == "0600"
    assert upload.dest.startswith("/etc/pdfleet/weights-") and upload.dest.endswith(".headers")
    removed = next(op for op in ops if isinstance(op, HeadersRemoved))
    staged = FakeFacts(
        {
            StagedFiles(directory, paths): StagedState({f.path: f.sha256 for f in manifest.files}, {}, 0),
            FileState(headers.path): None,
        }
    )
    assert headers.plan(staged) == [] and removed.plan(staged) == []  # a converged host never gets it
    lab_gw = fleet.context(fleet.inventory.hosts["lab-gw"])
    assert not weights.applies(lab_gw)  # only hosts that download from the hub
