"""This clone's pdfleet wheel reaches gateway hosts by upload, not through the site's index: the cached
build per source version, and the gateway role installing from the uploaded file."""

from __future__ import annotations

import dataclasses
import zipfile
from pathlib import Path

import roles.gateway as gateway_role
from pdfleet.fleet.host_version import wheel_version
from pdfleet.fleet.host_wheel import clone_wheel, wheel_name
from pdfleet.fleet.provision import load_deployment
from pdfleet.fleet.secrets import GatewaySecrets
from pdfleet.ops.base import FakeFacts, Run
from pdfleet.ops.files import File
from pdfleet.ops.pip import PipList, PipRequirements

REPO = Path(__file__).resolve().parents[2]
SECRETS = GatewaySecrets(client_sha256="1" * 64, admin_sha256="2" * 64)


def test_gateway_role_uploads_the_wheel_and_pip_installs_from_it(tmp_path: Path) -> None:
    wheel = tmp_path / wheel_name(wheel_version())
    wheel.write_bytes(b"PK-not-really-a-wheel")
    deployment = load_deployment("lab-cross", REPO / "inventory/lab.yml", REPO / "profiles",
                                 REPO / "templates", gateway_secrets=SECRETS)
    deployment = dataclasses.replace(deployment, pdfleet_wheel=wheel)
    host = deployment.inventory.hosts["lab-gw"]
    ops = list(gateway_role.operations(deployment.context(host), FakeFacts()))
    uploads = [op for op in ops if isinstance(op, File) and op.path == f"/opt/pdfleet/wheels/{wheel.name}"]
    assert len(uploads) == 1 and uploads[0].content == wheel.read_bytes() and uploads[0].mode == "0644"
    pips = [op for op in ops if isinstance(op, PipRequirements) and op.venv == "/opt/pdfleet/gateway"]
    assert len(pips) == 1
    assert ops.index(uploads[0]) < ops.index(pips[0])  # the file is there before pip looks for it
    (change,) = [c for c in pips[0].plan(FakeFacts({PipList(pips[0].venv): {}})) if "install" in c.diff]
    (cmd,) = [c.cmd for c in change.commands if isinstance(c, Run)]
    assert f"--find-links /opt/pdfleet/wheels pdfleet=={wheel_version()}" in cmd.replace("'", "")
    # without a wheel (a site whose index serves it) nothing is uploaded
    plain = list(gateway_role.operations(dataclasses.replace(deployment, pdfleet_wheel=None).context(host),
                                         FakeFacts()))
    assert not any(isinstance(op, File) and op.path.startswith("/opt/pdfleet/wheels/") for op in plain)


def test_clone_wheel_is_built_once_per_version_and_older_ones_go(tmp_path: Path) -> None:
    current = tmp_path / wheel_name(wheel_version())
    current.write_bytes(b"cached")
    old = tmp_path / wheel_name("0.1.0+g000000000000")
    old.write_bytes(b"old")
    assert clone_wheel(REPO, tmp_path) == current
    assert current.read_bytes() == b"cached"  # not rebuilt
    assert not old.exists()


def test_clone_wheel_builds_an_installable_wheel_of_this_clone(tmp_path: Path) -> None:
    """A real build through pip and the configured index (as on an operator's machine)."""
    wheel = clone_wheel(REPO, tmp_path / "cache")
    assert wheel.name == wheel_name(wheel_version())
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "pdfleet/gateway/upstream.py" in names
        meta = zf.read(f"pdfleet-{wheel_version()}.dist-info/METADATA").decode()
    assert f"Version: {wheel_version()}" in meta
    again = clone_wheel(REPO, tmp_path / "cache")
    assert again == wheel and again.stat().st_mtime == wheel.stat().st_mtime
