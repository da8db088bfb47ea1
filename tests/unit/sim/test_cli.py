"""`pdfleet-sim`: the console entry point's exit codes and messages."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pdfleet.sim.cli import main
from tests.unit.sim.helpers import MODEL

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_cli_exits_2_on_unknown_option_without_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pdfleet.sim.cli", "serve", MODEL, "--bogus"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "unrecognized arguments: --bogus" in proc.stderr and "Traceback" not in proc.stderr
    help_out = subprocess.run(
        [sys.executable, "-m", "pdfleet.sim.cli", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert help_out.returncode == 0 and "SIMULATED seconds" in help_out.stdout


def test_usage_without_a_command_and_unknown_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "usage: pdfleet-sim serve MODEL" in capsys.readouterr().out
    assert main(["run"]) == 2
    assert "unknown command 'run'" in capsys.readouterr().err


def test_bad_options_exit_2_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "mistralai/Mistral-7B"]) == 2
    assert "not in the simulator's catalog" in capsys.readouterr().err
