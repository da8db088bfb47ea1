"""Molecule scenarios over the lab: the default scenario's destroy takes the lab down; `molecule test --all`
passes (one lab booted by the default scenario's create; per lab profile syntax → converge → idempotence →
verify, each converging over the previous one); and its idempotence step fails when a converge is made
non-idempotent on purpose (a template rendering random text each time).

The session (tests/lab/conftest.py: FIRST) runs the destroy, then provision's from-scratch test on the bare
hosts the lab comes back with, then `test --all --destroy never` over that lab-cross fleet: one converge from
bare hosts per session instead of two, and `test --all` leaves lab-same-host converged, the fleet provision's
0.11 test checks next. `test --all` leaves out two scenarios (`--exclude`), each covered elsewhere in the
session: lab-cross's converge and idempotence run through Molecule in the non-idempotent test below
(`molecule converge/idempotence -s lab-cross`), its converge's second run changing nothing is provision's
from-scratch test and its verify is test_lab_verify's `invoke verify --profile lab-cross`; lab-colocated is
lab-cross's colocated pool alone (the same roles and units on the same hosts, less the P/D pair), ~40 s of
the suite, and runs by itself with `molecule test -s lab-colocated`. The shared playbooks run for
lab-same-host."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.helpers import REPO_ROOT, LabCrossOwed, LabHandle

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


def test_idempotence_fails_when_a_converge_is_not_idempotent(
    lab: LabHandle, lab_cross_owed: LabCrossOwed, tmp_path: Path
) -> None:
    """The P/D router's unit template gains a comment line of random text: every converge rewrites the
    unit, so the second converge reports a change and Molecule's idempotence step fails, naming the
    provision task. It runs last, right after the modules that switch profiles (create finds the lab up):
    its first converge takes the fleet to lab-cross from whatever they left, and its closing provision puts
    lab-cross back on its colocated stage with the shipped templates, paying the lab-cross they owe
    (tests/lab/conftest.py: PAYS_LAB_CROSS). The router's unit, not the vLLM env file: a change restarts one
    router on lab-gw instead of every simulator (three converges here), and the idempotence check is the
    same."""
    templates = tmp_path / "templates"
    shutil.copytree(REPO_ROOT / "templates", templates)
    unit_template = templates / "vllm-router-pd.service.j2"
    unit_template.write_text(unit_template.read_text() + "# {{ lipsum(1, False, 3, 5) }}\n")
    env = {"INVOKE_PDFLEET_TEMPLATES_DIR": str(templates)}
    try:
        converged = molecule("converge", "-s", "lab-cross", env=env)
        assert converged.returncode == 0, (converged.stdout + converged.stderr)[-4000:]
        second = molecule("idempotence", "-s", "lab-cross", env=env)
    finally:
        # the session's lab, converged with the shipped templates again (no destroy: the lab stays up)
        restored = subprocess.run(
            [sys.executable, "-m", "invoke", "provision", "--profile", "lab-cross", "--stage", "colocated"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
    assert restored.returncode == 0, restored.stderr[-3000:]
    lab_cross_owed.owed = False
    out = second.stdout + second.stderr
    assert second.returncode != 0, out[-4000:]
    assert "Provision lab-cross" in out and "idempoten" in out.lower(), out[-4000:]


def test_molecule_destroy_takes_the_lab_down(lab: LabHandle) -> None:
    """Molecule's own destroy (the lab taken down; its state then says "not created", so the next `test
    --all` runs create); the lab is booted again, bare, for provision's from-scratch test."""
    destroyed = molecule("destroy", "-s", "default")
    down = destroyed.stdout + destroyed.stderr
    try:
        assert destroyed.returncode == 0, down[-4000:]
        assert re.findall(r"\[(\S+) > destroy\] Executing", down) == ["default"], down[-4000:]
        assert "TASK [Take the lab down]" in down, down[-4000:]
    finally:
        lab.up()


def test_molecule_test_all_scenarios_pass(lab: LabHandle) -> None:
    """Runs after the destroy above (Molecule's state "not created"): create boots, or with the lab up keeps,
    the lab once for the whole run, and the first scenario converges over the fleet the lab has."""
    try:
        result = molecule(
            "test", "--all", "--exclude", "lab-cross", "--exclude", "lab-colocated", "--destroy", "never"
        )
    finally:
        lab.up()  # cheap when up; the session's teardown expects it up even if the run failed
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    for step in ("syntax", "converge", "idempotence", "verify"):
        assert f"lab-same-host > {step}: Executed: Successful" in out, (step, out[-6000:])
    # excluded: none of their steps ran (Molecule still reads their configs, and may warn about them)
    assert re.findall(r"\[lab-(?:cross|colocated) > (\w+)\] Executing", out) == [], out[-6000:]
    # shared state: the default scenario's create, once for the whole run; its destroy, the only one, was
    # skipped (its playbook's task never ran), so the lab stays up with lab-same-host converged
    assert "default > create: Executed: Successful" in out, (
        "Molecule's create did not run: its state says the lab is created (run the session's order: "
        "test_molecule_destroy_takes_the_lab_down first)",
        out[-6000:],
    )
    assert re.findall(r"\[(\S+) > create\] Executing", out) == ["default"], out[-6000:]
    assert re.findall(r"\[(\S+) > destroy\] Executing", out) == ["default"], out[-6000:]
    assert "[default > destroy] Skipping, '--destroy=never' requested." in out, out[-6000:]
    assert "TASK [Take the lab down]" not in out, out[-6000:]
