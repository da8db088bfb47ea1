"""invoke profiles: lists and validates every profile, optionally against an inventory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.model.helpers import PROFILES, REPO

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the real `invoke` of this venv from the repo root, as an operator would."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "invoke"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_invoke_profiles_lists_and_exits_zero() -> None:
    proc = _invoke("profiles")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["PROFILE", "TOPOLOGY", "ENGINE", "CONNECTOR", "VLLM", "STATUS"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:] if line.strip()}
    assert rows["cross-rdma"] == ["cross-host", "vllm", "NixlConnector", "0.33.0", "ok"]
    assert rows["colocated"] == ["colocated", "vllm", "-", "0.33.0", "ok"]
    assert rows["lab-same-host"] == ["same-host", "sim", "NixlConnector", "0.11.0", "ok"]
    assert "_base" not in rows
    # the shipped vLLM profiles leave the hub revision floating: warned about, still ok (issue 31)
    assert "\ncross-rdma: warning\n  profiles/_base.yml: model.revision: unset: " in proc.stdout
    assert "lab-cross: warning" not in proc.stdout  # the simulator loads no weights; HTTPS
    # plain HTTP is warned about where a profile asks for it (issue 28), HTTPS is not
    plain = (
        "  profiles/lab-cross-plain.yml: gateway.tls: the gateway listens in plain HTTP (gateway.tls: off)"
    )
    assert f"\nlab-cross-plain: warning\n{plain}" in proc.stdout
    assert "cross-rdma: warning\n  profiles/_base.yml: gateway.tls" not in proc.stdout


def test_invoke_profiles_fails_on_invalid_profile(tmp_path: Path) -> None:
    (tmp_path / "_base.yml").write_text((PROFILES / "_base.yml").read_text())
    (tmp_path / "colocated.yml").write_text((PROFILES / "colocated.yml").read_text())
    (tmp_path / "bad.yml").write_text(
        "extends: colocated\npools: {colocated: {gpu_memory_utilization: 0.99}}\n"
    )
    proc = _invoke("profiles", "--profiles-dir", str(tmp_path))
    assert proc.returncode == 1
    assert f"{tmp_path / 'bad.yml'}: pools.colocated.gpu_memory_utilization: must be <= 0.98" in proc.stdout
    assert "1 of 2 profiles invalid: bad" in proc.stderr


def test_invoke_profiles_with_inventory_runs_semantic_checks() -> None:
    inv = "inventory/examples/cross-rdma.yml"
    ok = _invoke("profiles", "--inventory", inv, "--profile", "cross-rdma")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert f"ok (fits {inv})" in ok.stdout
    bad = _invoke("profiles", "--inventory", inv, "--profile", "same-host-pcie")
    assert bad.returncode == 1
    assert (
        f"profiles/same-host-pcie.yml: topology: same-host needs a host in both groups prefill and "
        f"decode; in {inv}"
    ) in bad.stdout


def test_invoke_profiles_unknown_inventory_is_one_clean_error() -> None:
    proc = _invoke("profiles", "--inventory", "inventory/nope.yml")
    assert proc.returncode != 0
    assert "inventory/nope.yml: file not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_one_bad_file_does_not_stop_the_listing_of_the_rest(tmp_path: Path) -> None:
    (tmp_path / "_base.yml").write_text((PROFILES / "_base.yml").read_text())
    (tmp_path / "colocated.yml").write_text((PROFILES / "colocated.yml").read_text())
    bomb = "".join(
        ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"]
        + [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]\n" for i in range(1, 10)]
    )
    (tmp_path / "bomb.yml").write_text(bomb)
    (tmp_path / "latin1.yml").write_bytes(b"extends: colocated\ndescription: caf\xe9\n")
    (tmp_path / "deep.yml").write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "newline.yml").write_text('extends: colocated\nmodel: {id: "m\\nx"}\n')
    (tmp_path / "stage.yml").write_text("extends: colocated\ngateway: {stage: off}\n")
    started = time.monotonic()
    proc = _invoke("profiles", "--profiles-dir", str(tmp_path))
    assert time.monotonic() - started < 30
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    table = proc.stdout.split("\n\n")[0].splitlines()[1:]
    rows = {line.split()[0]: line.split()[-1] for line in table}
    assert rows == {
        "bomb": "INVALID",
        "colocated": "ok",
        "deep": "INVALID",
        "latin1": "INVALID",
        "newline": "INVALID",
        "stage": "INVALID",
    }, proc.stdout
    for expected in (
        f"{tmp_path / 'bomb.yml'}: aliases expand the document to more than",
        f"{tmp_path / 'latin1.yml'}:2: not valid UTF-8",
        f"{tmp_path / 'deep.yml'}:1:",
        "nested deeper than 64 levels",
        f"{tmp_path / 'newline.yml'}: model.id: the value 'm\\nx' contains the control",
        f"{tmp_path / 'stage.yml'}: gateway.stage: must be a string, but YAML read the",
    ):
        assert expected in proc.stdout, proc.stdout
    assert "5 of 6 profiles invalid" in proc.stderr
