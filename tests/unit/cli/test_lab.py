"""`invoke lab.*` tasks that need no root: lab.env's exports and errors, lab.up's --inventory errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from invoke.exceptions import Exit

import pdfleet.cli.lab as cli_lab
from pdfleet.lab.paths import LabPaths
from tests.unit.cli.helpers import project_context
from tests.unit.lab.helpers import LAB_YML, REPO, lab_of


def test_lab_env_prints_exports_or_says_the_gateway_is_not_provisioned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lab = lab_of(LAB_YML, LabPaths(tmp_path))
    monkeypatch.setattr(cli_lab, "this_lab", lambda: lab)
    with pytest.raises(Exit) as exc:
        cli_lab.env_task(project_context())
    assert exc.value.code != 0
    assert "not provisioned yet" in capsys.readouterr().err
    lab.paths.gateway_client_key.write_text("sk-lab-123\n")
    cli_lab.env_task(project_context())
    assert capsys.readouterr().out.splitlines() == [  # HTTPS with the lab CA
        "export OPENAI_BASE_URL=https://198.18.0.10:8080/v1",
        "export OPENAI_API_KEY=sk-lab-123",
        "export ANTHROPIC_BASE_URL=https://198.18.0.10:8080",
        "export ANTHROPIC_API_KEY=sk-lab-123",
        "export SSL_CERT_FILE=/var/lib/pdfleet-lab/tls/ca.crt",
    ]
    cli_lab.env_task(project_context(), profile="lab-cross-plain")  # plain HTTP, no CA to trust
    out = capsys.readouterr().out
    assert "export OPENAI_BASE_URL=http://198.18.0.10:8080/v1" in out and "SSL_CERT_FILE" not in out
    # the port is the provisioned profile's, not a constant
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    (profiles / "lab-alt-port.yml").write_text("extends: lab-cross\ngateway:\n  port: 9080\n")
    ctx = project_context(profiles_dir=str(profiles))
    cli_lab.env_task(ctx, profile="lab-alt-port")
    assert capsys.readouterr().out.splitlines()[0] == "export OPENAI_BASE_URL=https://198.18.0.10:9080/v1"
    with pytest.raises(Exit):
        cli_lab.env_task(ctx, profile="no-such-profile")
    assert "no-such-profile" in capsys.readouterr().err


def test_lab_up_with_an_inventory_that_does_not_exist_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "fleet.yml"
    with pytest.raises(Exit) as exc:
        cli_lab.up_task(project_context(), inventory=str(missing))
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert f"lab inventory {missing} does not exist" in err and "Traceback" not in err
