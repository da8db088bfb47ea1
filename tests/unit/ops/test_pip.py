"""venvs: `pip list` on real outputs and this project's venv, PipRequirements plans."""

from __future__ import annotations

import pytest

from pdfleet.ops.base import FakeFacts
from pdfleet.ops.errors import FactError, OperationError
from pdfleet.ops.gather import HostFacts
from pdfleet.ops.pip import PipList, PipRequirements, parse_pip_list_json
from pdfleet.ops.ssh import LocalTransport
from tests.unit.ops.helpers import commands

PIP_JSON = (
    '[{"name": "aiohttp", "version": "3.14.5"}, {"name": "nixl", "version": "0.3.1"}, '
    '{"name": "Jinja2", "version": "3.1.6"}, {"name": "vllm_router", "version": "0.1.17"}, '
    '{"name": "pdfleet", "version": "0.1.0", "editable_project_location": "/work/main"}]'
)


def test_pip_list_json() -> None:
    listed = parse_pip_list_json(PIP_JSON)
    assert listed == {
        "aiohttp": "3.14.5",
        "nixl": "0.3.1",
        "jinja2": "3.1.6",
        "vllm-router": "0.1.17",
        "pdfleet": "0.1.0",
    }
    assert PipList("/opt/v").parse("", 3) is None
    with pytest.raises(FactError):
        PipList("/opt/v").parse("Traceback", 1)


def test_pip_list_fact_on_a_real_venv() -> None:
    """PipList's command works against this project's own venv."""
    import sys

    venv = sys.prefix
    value = HostFacts(LocalTransport()).get(PipList(venv))
    assert value is not None and "pytest" in value
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
