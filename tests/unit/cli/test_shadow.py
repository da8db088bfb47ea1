"""`invoke shadow` and its subtasks at the task layer: listed, every option has help, and bad options are one
clear error before any gateway is contacted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.unit.cli.helpers import invoke_many

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

REPO = Path(__file__).resolve().parents[3]


def test_the_tasks_are_listed_and_every_option_has_help() -> None:
    names = ("shadow", "shadow.status", "shadow.stop", "shadow.report")
    listing, *helps = invoke_many([["--list"], *(["--help", name] for name in names)])
    for task in ("shadow.start (shadow)", "shadow.status", "shadow.stop", "shadow.report"):
        assert task in listing.stdout
    for name, shown in zip(names, helps, strict=True):
        out = shown.stdout
        options = [ln for ln in out.splitlines() if ln.strip().startswith("-")]
        assert options
        for line in options:
            assert len(line.strip().split("  ", 1)) == 2, f"{name}: no help: {line}"


BAD = [
    (["--stage", "long-prompts", "--share", "0"], "error: --share: 0 is not between 1 and 100"),
    (["--stage", "long-prompts", "--share", "lots"], "error: --share: 'lots' is not a whole percent"),
    (
        ["--stage", "long-prompts", "--share", "20", "--minutes", "-1"],
        "error: --minutes: -1 must be more",
    ),
    (["--stage", "long-prompts", "--share", "20", "--model", "nope"], "nope"),
]


@pytest.fixture(scope="module")
def bad_runs() -> list[subprocess.CompletedProcess[str]]:
    """BAD's `invoke shadow` commands, each through invoke's CLI, in one process."""
    return invoke_many([["shadow", "--profile", "lab-cross", *args] for args, _ in BAD])


@pytest.mark.parametrize(("case", "args", "message"), [(n, *c) for n, c in enumerate(BAD)])
def test_bad_options_are_one_clear_error(
    case: int, args: list[str], message: str, bad_runs: list[subprocess.CompletedProcess[str]]
) -> None:
    proc = bad_runs[case]
    assert proc.args[-len(args) :] == args
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_report_refuses_a_bad_window_and_prometheus_url() -> None:
    window, url = invoke_many(
        [
            ["shadow.report", "--profile", "lab-cross", "--minutes", "0"],
            ["shadow.report", "--profile", "lab-cross", "--prometheus", "nope"],
        ]
    )
    assert "error: --minutes: 0 must be more than 0" in window.stderr
    proc = url
    assert "error: --prometheus: 'nope' is not an http(s) URL" in proc.stderr
