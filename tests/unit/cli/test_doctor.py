"""`invoke doctor` as the operator runs it: bad input is one clear line and a non-zero exit, no traceback;
a real gateway on loopback gives JSON and the exit status of its findings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pdfleet.bench.procs import free_port
from tests.unit.cli.helpers import REPO

BAD = [
    (["doctor"], "give --base-url URL"),
    (["doctor", "--base-url", "ftp://x/v1", "--api-key-env", "HOME"], "not an http:// or https:// URL"),
    (["doctor", "--base-url", "http://127.0.0.1:8080/v1"], "give --api-key-env VAR"),
    (
        ["doctor", "--base-url", "http://127.0.0.1:8080/v1", "--api-key-env", "PDFLEET_NO_SUCH_VAR"],
        "is not set",
    ),
    (["doctor", "--profile", "no-such-profile"], "no-such-profile"),
    (["doctor", "--profile", "lab-cross", "--base-url", "http://127.0.0.1:1/v1"], "separate runs"),
    (
        [
            "doctor",
            "--base-url",
            "http://127.0.0.1:8080/v1",
            "--api-key-env",
            "HOME",
            "--endpoint",
            "completions",
        ],
        "--endpoint and --body go together",
    ),
    (["doctor", "--profile", "lab-cross", "--minutes", "0"], "less than 1"),
]


def invoke(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    res = invoke(args)
    assert res.returncode != 0
    assert message in res.stderr and "Traceback" not in res.stderr + res.stdout


def test_refused_connection_as_json_exits_1() -> None:
    import os

    env = {**os.environ, "PDFLEET_DOCTOR_KEY": "sk-user-0123456789abcdef"}
    res = invoke(
        [
            "doctor",
            "--base-url",
            f"http://127.0.0.1:{free_port()}/v1",
            "--api-key-env",
            "PDFLEET_DOCTOR_KEY",
            "--json",
        ],
        env,
    )
    assert res.returncode == 1, res.stderr
    doc = json.loads(res.stdout)
    assert doc["findings"][0]["rule"] == "client.unreachable"
    assert "0123456789" not in res.stdout


def test_every_option_has_help() -> None:
    res = invoke(["--help", "doctor"])
    for option in ("--base-url", "--api-key-env", "--anthropic", "--profile", "--json", "--body", "--sample"):
        assert option in res.stdout
