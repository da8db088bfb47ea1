"""Molecule scenarios over the lab: `molecule test --all` passes (create → converge → idempotence → verify →
destroy per lab profile), and its idempotence step fails when a converge is made non-idempotent on purpose
(a template rendering random text each time). Each scenario boots, provisions from scratch and removes
its own lab, so these tests restore the session's lab afterwards. Cost here: about 100 s per scenario."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.helpers import REPO_ROOT, LabHandle

VENV_BIN = Path(sys.executable).parent


def molecule(
    *args: str, env: dict[str, str] | None = None, timeout: float = 1200
) -> subprocess.CompletedProcess[str]:
    """Run molecule from the repository root with this venv's ansible and invoke on PATH."""
    if shutil.which("molecule", path=str(VENV_BIN)) is None:
        pytest.fail("molecule is not installed in this venv: pip install -e '.[test]'")
    full_env = {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        "ANSIBLE_NOCOLOR": "1",
        "PY_COLORS": "0",
        **(env or {}),
    }
    return subprocess.run(
        [str(VENV_BIN / "molecule"), *args],
        cwd=REPO_ROOT,
        env=full_env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def test_idempotence_fails_when_a_converge_is_not_idempotent(lab: LabHandle, tmp_path: Path) -> None:
    """The env file template gains a line of random text: every converge rewrites it, so the second
    converge reports a change and Molecule's idempotence step fails, naming the provision task. It runs
    on the session's lab (create finds it up), before `test --all` takes the lab down and up."""
    templates = tmp_path / "templates"
    shutil.copytree(REPO_ROOT / "templates", templates)
    env_template = templates / "vllm.env.j2"
    env_template.write_text(env_template.read_text() + "# {{ lipsum(1, False, 3, 5) }}\n")
    env = {"INVOKE_PDFLEET_TEMPLATES_DIR": str(templates)}
    try:
        converged = molecule("converge", "-s", "lab-cross", env=env)
        assert converged.returncode == 0, (converged.stdout + converged.stderr)[-4000:]
        second = molecule("idempotence", "-s", "lab-cross", env=env)
    finally:
        # the session's lab, converged with the shipped templates again (no destroy: `test --all` next
        # starts with one)
        restored = subprocess.run(
            [sys.executable, "-m", "invoke", "provision", "--profile", "lab-cross"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert restored.returncode == 0, restored.stderr[-3000:]
    out = second.stdout + second.stderr
    assert second.returncode != 0, out[-4000:]
    assert "Provision lab-cross" in out and "idempoten" in out.lower(), out[-4000:]


def test_molecule_test_all_scenarios_pass(lab: LabHandle) -> None:
    try:
        result = molecule("test", "--all")
    finally:
        lab.up()  # the scenarios leave the lab down; the session's other tests expect it up
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    out = result.stdout + result.stderr
    for scenario in ("lab-cross", "lab-same-host", "lab-colocated"):
        assert scenario in out
