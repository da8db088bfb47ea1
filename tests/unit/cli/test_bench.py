"""`invoke bench` at the task layer: every option has help; bad options are one clear error before anything
is contacted or written (no traceback, no output directory)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_is_listed_and_every_option_has_help() -> None:
    assert any(ln.strip().startswith("bench ") for ln in _invoke("--list").stdout.splitlines())
    out = _invoke("--help", "bench").stdout
    options = [ln for ln in out.splitlines() if ln.strip().startswith("--")]
    assert len(options) >= 18
    for line in options:
        assert len(line.split("  ", 1)) == 2 and line.split("  ", 1)[1].strip(), f"no help: {line}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "1", "--concurrency", "2"], "error: give --rate R or --concurrency C, not both"),
        (
            ["--workload", "nope"],
            "error: --workload 'nope': not a workload; choose one of random, long-prompt-mix",
        ),
        (
            ["--pools", "colocated,pd"],
            "error: --pools colocated,pd: pd is not a pool; pools are colocated, disagg",
        ),
        (["--rate", "fast"], "error: --rate 'fast': not a number"),
        (["--duration", "10", "--num-prompts", "5"], "error: give --duration S or --num-prompts N, not both"),
        (
            ["--workload", "trace"],
            "error: --workload trace needs --dataset PATH (a Mooncake trace JSONL file)",
        ),
        (["--workload", "trace", "--dataset", "no/such.jsonl"], "error: --dataset"),
    ],
)
def test_bad_options_are_one_clear_error_and_write_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    proc = _invoke("bench", "--profile", "lab-cross", "--out", str(out), *args)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_pool_the_profile_lacks_is_refused() -> None:
    proc = _invoke("bench", "--profile", "lab-colocated", "--pools", "disagg")
    assert proc.returncode != 0
    assert (
        "error: --pools: profile lab-colocated has no disagg pool behind its gateway (it has: colocated)"
        in proc.stderr
    )
