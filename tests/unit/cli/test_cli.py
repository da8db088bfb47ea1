"""The task layer: every task is listed with help, and bad input exits non-zero with one paragraph
(no traceback) before anything is touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
INVOKE = [sys.executable, "-m", "invoke"]
CROSS = "inventory/examples/cross-rdma.yml"


def _invoke(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*INVOKE, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_list_shows_every_task_with_its_help() -> None:
    out = _invoke("--list").stdout
    for name in ("profiles", "render", "provision", "verify", "demo", "lab.up", "lab.down", "lab.status",
                 "lab.ssh", "lab.env"):
        line = next((ln for ln in out.splitlines() if ln.strip().startswith(name + " ")), "")
        assert line.strip() != name and len(line.split()) > 1, f"{name} has no help line in --list"


@pytest.mark.parametrize("task", ["render", "provision"])
def test_every_option_has_help(task: str) -> None:
    out = _invoke("--help", task).stdout
    options = [ln for ln in out.splitlines() if ln.strip().startswith("-")]
    assert options
    for line in options:
        assert len(line.split("  ", 1)) == 2 and line.split("  ", 1)[1].strip(), f"no help: {line}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["render", "--profile", "no-such-profile", "--inventory", CROSS], "available"),
        (["render", "--profile", "cross-rdma", "--inventory", "inventory/nope.yml"], "nope.yml"),
        (["render", "--profile", "cross-rdma", "--inventory", "inventory/examples/same-host-pcie.yml"],
         "same-host-pcie.yml"),
        (["render", "--profile", "cross-rdma", "--inventory", CROSS, "--limit", "ghost"], "ghost"),
        (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--roles", "bogus"], "bogus"),
        (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--serial", "-1"], "--serial"),
        (["provision", "--profile", "cross-rdma", "--inventory", CROSS, "--limit", "ghost,pf-01"], "ghost"),
    ],
)
def test_bad_input_is_one_paragraph_and_changes_nothing(
    args: list[str], expected: str, tmp_path: Path
) -> None:
    out_dir = tmp_path / "out"
    if args[0] == "render":
        args = [*args, "--out", str(out_dir)]
    proc = _invoke(*args)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    message = proc.stderr.strip()
    assert message.startswith("error:"), message
    assert expected in message
    assert "\n\n" not in message, "one paragraph"
    assert not out_dir.exists(), "nothing written on bad input"
