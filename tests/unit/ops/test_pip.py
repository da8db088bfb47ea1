"""venvs: the installed-distributions fact on real outputs and this project's venv, PipRequirements plans."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from packaging.version import Version

from pdfleet.ops.base import FakeFacts
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.pip import PipList, PipRequirements, canonical_pip_name, parse_metadata_dirs
from pdfleet.ops.ssh import LocalTransport
from tests.unit.ops.helpers import commands

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

SITE_DIRS = "\n".join(
    [
        "aiohttp-3.14.5.dist-info",
        "nixl-0.3.1.dist-info",
        "Jinja2-3.1.6.dist-info",
        "vllm_router-0.1.17.dist-info",
        "pdfleet-0.1.0+h4be40c7a72c0.dist-info",
        "legacy_thing-2.0-py3.11.egg-info",
        "develop.egg-info",  # no version: not a distribution pip would list by it
    ]
)


def test_pip_list_from_metadata_dir_names() -> None:
    listed = parse_metadata_dirs(SITE_DIRS)
    assert listed == {
        "aiohttp": "3.14.5",
        "nixl": "0.3.1",
        "jinja2": "3.1.6",
        "vllm-router": "0.1.17",
        "pdfleet": "0.1.0+h4be40c7a72c0",
        "legacy-thing": "2.0",
    }
    assert PipList("/opt/v").parse("", 3) is None
    with pytest.raises(FactError):
        PipList("/opt/v").parse("", 1)


def test_pip_list_fact_agrees_with_pip_on_a_real_venv() -> None:
    """PipList's command on this project's own venv finds what `pip list` finds, at the same versions."""
    venv = sys.prefix
    value = HostFacts(LocalTransport()).get(PipList(venv))
    assert value is not None and "pytest" in value
    argv = [sys.executable, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"]
    pip = subprocess.run(argv, capture_output=True, text=True, check=True)
    expected = {canonical_pip_name(r["name"]): Version(r["version"]) for r in json.loads(pip.stdout)}
    assert {name: Version(v) for name, v in value.items()} == expected
    assert HostFacts(LocalTransport()).get(PipList("/nonexistent/venv")) is None


def test_pip_requirements_converged_and_upgrade() -> None:
    op = PipRequirements(
        "/opt/pdfleet/venv",
        ("vllm==0.8.5", "nixl>=0.3"),
        index_url="http://198.18.0.1:8082/simple/",
        trusted_host="198.18.0.1",
    )
    assert op.plan(FakeFacts({PipList("/opt/pdfleet/venv"): {"vllm": "0.8.5", "nixl": "0.3.1"}})) == []
    changes = op.plan(FakeFacts({PipList("/opt/pdfleet/venv"): {"vllm": "0.8.4", "nixl": "0.3.1"}}))
    assert commands(changes) == [
        "/opt/pdfleet/venv/bin/python -m pip install --disable-pip-version-check -q "
        "--index-url http://198.18.0.1:8082/simple/ --trusted-host 198.18.0.1 vllm==0.8.5"
    ]
    assert "+ vllm==0.8.5 (have 0.8.4)" in changes[0].diff


def test_pip_requirements_into_missing_venv_creates_it_first() -> None:
    op = PipRequirements("/opt/v", ["vllm-router==0.1.17"])
    changes = op.plan(FakeFacts({PipList("/opt/v"): None}))
    assert commands(changes) == [
        "python3 -m venv /opt/v",
        "/opt/v/bin/python -m pip install --disable-pip-version-check -q vllm-router==0.1.17",
    ]
    # name normalization: vllm_router installed satisfies vllm-router
    assert op.plan(FakeFacts({PipList("/opt/v"): {"vllm-router": "0.1.17"}})) == []


def test_pip_requirements_rejects_bad_requirement() -> None:
    with pytest.raises(OperationError, match="invalid"):
        PipRequirements("/opt/v", ("vllm===",))
