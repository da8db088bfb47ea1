"""`invoke doctor` as the operator runs it: bad input is one clear line and a non-zero exit, no traceback;
a real gateway on loopback gives JSON and the exit status of its findings."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port
from tests.unit.cli.helpers import REPO, invoke_many

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

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
    (["doctor", "--base-url", "http://127.0.0.1:8080/v1", "--timeout", "1e308"], "is more than 3600"),
    (  # N12: /dev/zero was read whole before the 1 MiB check
        ["doctor", "--base-url", "http://127.0.0.1:8080/v1", "--api-key-env", "HOME", "--endpoint"]
        + ["completions", "--body", "/dev/zero"],
        "--body /dev/zero: larger than",
    ),
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


@pytest.fixture(scope="module")
def runs() -> list[subprocess.CompletedProcess[str]]:
    """BAD's commands then `invoke --help doctor`, each through invoke's CLI, in one process."""
    return invoke_many([args for args, _ in BAD] + [["--help", "doctor"]])


@pytest.mark.parametrize(("case", "args", "message"), [(n, *c) for n, c in enumerate(BAD)])
def test_bad_input_is_a_clear_error(
    case: int, args: list[str], message: str, runs: list[subprocess.CompletedProcess[str]]
) -> None:
    res = runs[case]
    assert res.args[1:] == args
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


def test_every_option_has_help(runs: list[subprocess.CompletedProcess[str]]) -> None:
    res = runs[-1]
    assert res.returncode == 0, res.stderr
    for option in ("--base-url", "--api-key-env", "--anthropic", "--profile", "--json", "--body", "--sample"):
        assert option in res.stdout


def _loopback_fleet(tmp_path: Path, sshd, port: int) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    """same-host-pcie on this machine's sshd (prefill and decode on `loop`, colocated on `colo`), its side
    channel on `port`: (profile file, inventory file)."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    prof = profiles / "loop.yml"
    prof.write_text(f"extends: same-host-pcie\nkv_transfer:\n  side_channel_port: {port}\n")
    host = (
        f"          ansible_host: 127.0.0.1\n          ansible_port: {sshd.port}\n"
        f"          ansible_user: root\n          ansible_ssh_private_key_file: {sshd.key_file}\n"
        f"          pdfleet_known_hosts_file: {sshd.known_hosts}\n"
    )
    inv = tmp_path / "inv.yml"
    inv.write_text(
        "all:\n  children:\n    prefill:\n      hosts:\n        loop:\n" + host + "          gpus: [0, 1]\n"
        "    decode:\n      hosts:\n        loop: {}\n"
        "    colocated:\n      hosts:\n        colo:\n" + host + "          gpus: [0]\n"
    )
    return prof, inv


@pytest.mark.sshd
def test_the_fleet_view_over_ssh(tmp_path: Path, sshd) -> None:  # type: ignore[no-untyped-def]
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        prof, inv = _loopback_fleet(tmp_path, sshd, port)
        args = ["doctor", "--profile", str(prof), "--inventory", str(inv), "--sample", "1", "--json"]
        open_ = invoke(args)
    doc = json.loads(open_.stdout)
    rules = {f["rule"]: f for f in doc["findings"]}
    # the side channel answers from the decode host; nothing else here is an error
    assert open_.returncode == 0 and "kv.side_channel" not in rules, open_.stdout + open_.stderr
    assert "metrics: direct scrape of 3 vLLM endpoints over 1 s\n" in open_.stderr  # no monitoring host
    assert (
        rules["kv.p2p"]["severity"] == "ok" and rules["kv.p2p"]["evidence"] == "no NVIDIA GPU on the PCI bus"
    )
    assert "no such unit file" in rules["fleet.instance_unread"]["evidence"]
    assert rules["metrics.unread"]["severity"] == "warning"
    closed = invoke(args)  # the listener is gone: the same connect is refused
    doc = json.loads(closed.stdout)
    side = next(f for f in doc["findings"] if f["rule"] == "kv.side_channel")
    assert closed.returncode == 1 and f"127.0.0.1:{port}" in side["what"] and "refused" in side["what"]


def test_a_body_nested_too_deep_is_a_clear_error(tmp_path: Path) -> None:
    """N11: a 100k-deep --body ended in a RecursionError traceback."""
    from pdfleet.cli.doctor import script_call
    from pdfleet.errors import ValidationError

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValidationError, match="nested too deep"):
        script_call("completions", str(deep), False)


def test_a_password_in_the_base_url_is_refused_and_never_shown() -> None:
    """N14: it was printed in the report's title and a finding, and sent as Basic auth."""
    res = invoke(["doctor", "--base-url", "http://user:s3cret-pw@127.0.0.1:9/v1", "--api-key-env", "HOME"])
    assert res.returncode != 0 and "carries a user name or password" in res.stderr
    assert "s3cret-pw" not in res.stderr + res.stdout and "http://***@127.0.0.1:9/v1" in res.stderr
