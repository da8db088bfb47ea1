"""The gateway role: the host wheel reaches gateway hosts by upload, not through the site's index."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import roles.gateway as gateway_role
from pdfleet.fleet.host_wheel import wheel_name
from pdfleet.ops.base import FakeFacts, Run
from pdfleet.ops.files import File
from pdfleet.ops.pip import PipList, PipRequirements
from tests.unit.roles.helpers import deployment


def test_gateway_role_uploads_the_wheel_and_pip_installs_from_it(tmp_path: Path) -> None:
    fleet = deployment("lab-cross")
    wheel = tmp_path / wheel_name(fleet.host_version)
    wheel.write_bytes(b"PK-not-really-a-wheel")
    fleet = dataclasses.replace(fleet, host_wheel=wheel)
    host = fleet.inventory.hosts["lab-gw"]
    ops = list(gateway_role.operations(fleet.context(host), FakeFacts()))
    uploads = [op for op in ops if isinstance(op, File) and op.path == f"/opt/pdfleet/wheels/{wheel.name}"]
    assert len(uploads) == 1 and uploads[0].content == wheel.read_bytes() and uploads[0].mode == "0644"
    pips = [op for op in ops if isinstance(op, PipRequirements) and op.venv == "/opt/pdfleet/gateway"]
    assert len(pips) == 1
    assert ops.index(uploads[0]) < ops.index(pips[0])  # the file is there before pip looks for it
    (change,) = [c for c in pips[0].plan(FakeFacts({PipList(pips[0].venv): {}})) if "install" in c.diff]
    (cmd,) = [c.cmd for c in change.commands if isinstance(c, Run)]
    assert f"--find-links /opt/pdfleet/wheels pdfleet=={fleet.host_version}" in cmd.replace("'", "")
    # without a wheel (a site whose index serves it) nothing is uploaded
    plain = list(gateway_role.operations(dataclasses.replace(fleet, host_wheel=None).context(host),
                                         FakeFacts()))
    assert not any(isinstance(op, File) and op.path.startswith("/opt/pdfleet/wheels/") for op in plain)
