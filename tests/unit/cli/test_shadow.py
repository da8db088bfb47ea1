"""`invoke shadow` and its subtasks at the task layer: listed, every option has help, and bad options are one
clear error before any gateway is contacted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

REPO = Path(__file__).resolve().parents[3]


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_the_tasks_are_listed_and_every_option_has_help() -> None:
    listed = _invoke("--list").stdout
    for name in ("shadow.start (shadow)", "shadow.status", "shadow.stop", "shadow.report"):
        assert name in listed
    for name in ("shadow", "shadow.status", "shadow.stop", "shadow.report"):
        out = _invoke("--help", name).stdout
        options = [ln for ln in out.splitlines() if ln.strip().startswith("-")]
        assert options
        for line in options:
            assert len(line.strip().split("  ", 1)) == 2, f"{name}: no help: {line}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stage", "long-prompts", "--share", "0"], "error: --share: 0 is not between 1 and 100"),
        (["--stage", "long-prompts", "--share", "lots"], "error: --share: 'lots' is not a whole percent"),
        (
            ["--stage", "long-prompts", "--share", "20", "--minutes", "-1"],
            "error: --minutes: -1 must be more",
        ),
        (["--stage", "long-prompts", "--share", "20", "--model", "nope"], "nope"),
    ],
)
def test_bad_options_are_one_clear_error(args: list[str], message: str) -> None:
    proc = _invoke("shadow", "--profile", "lab-cross", *args)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_refuses_a_bad_window_and_prometheus_url() -> None:
    proc = _invoke("shadow.report", "--profile", "lab-cross", "--minutes", "0")
    assert "error: --minutes: 0 must be more than 0" in proc.stderr
    proc = _invoke("shadow.report", "--profile", "lab-cross", "--prometheus", "nope")
    assert "error: --prometheus: 'nope' is not an http(s) URL" in proc.stderr
