"""`pdfleet-gateway` as a process: --check, refusing an exposed keys file, SIGHUP reload, SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pdfleet.gateway.keys import hash_key
from tests.unit.gateway.helpers import USER_KEY, policy_dict, write_keys, write_policy

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py

EXE = [sys.executable, "-m", "pdfleet.gateway.cli"]
POLICY = policy_dict(["http://127.0.0.1:9"], None)


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EXE, *args], input=stdin, capture_output=True, text=True, timeout=60)


def test_check_ok_and_bad(tmp_path: Path) -> None:
    path = write_policy(tmp_path, POLICY)
    r = _run("--config", str(path), "--check")
    assert r.returncode == 0 and "version 1, stage long-all, 1 model(s), 2 key(s)" in r.stdout
    path.write_text("version: 1\nmodels: {}\n")
    r = _run("--config", str(path), "--check")
    assert r.returncode == 2
    assert f"{path}: keys_file: required key is missing" in r.stderr and "Traceback" not in r.stderr


def test_check_refuses_a_rate_limit_no_bucket_can_hold(tmp_path: Path) -> None:
    """N5: `.inf` passed --check, then every request of every key was a 500 (OverflowError)."""
    path = write_policy(tmp_path, {**POLICY, "limits": {"default": {"requests_per_second": float("inf")}}})
    assert ".inf" in path.read_text()
    r = _run("--config", str(path), "--check")
    assert r.returncode == 2 and "limits.default.requests_per_second" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_refuses_group_readable_keys_file(tmp_path: Path) -> None:
    write_keys(tmp_path / "keys.yaml", 0o644)
    path = write_policy(tmp_path, POLICY)
    r = _run("--config", str(path))
    assert r.returncode == 2
    assert "group/world-accessible (mode 0644)" in r.stderr and "chmod 600" in r.stderr


def test_hash_key_reads_stdin() -> None:
    r = _run("--hash-key", stdin=USER_KEY + "\n")
    assert r.returncode == 0 and r.stdout.strip() == hash_key(USER_KEY)
    assert _run("--hash-key", stdin=" spaced\n").returncode == 2


def _health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        return json.loads(r.read())


def _wait_for(cond, timeout: float = 15) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


@pytest.mark.timeout(60)
def test_sighup_reloads_and_bad_policy_is_rejected(tmp_path: Path) -> None:
    path = write_policy(tmp_path, POLICY)
    proc = subprocess.Popen([*EXE, "--config", str(path)], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        assert m, line
        port = int(m.group(1))
        assert _health(port)["policy_version"] == 1
        write_policy(tmp_path, {**POLICY, "version": 2, "stage": "off"})
        proc.send_signal(signal.SIGHUP)
        _wait_for(lambda: _health(port)["policy_version"] == 2)
        assert _health(port)["stage"] == "off"
        (tmp_path / "policy.yaml").write_text("version: 3\nnot_a_key: true\n")
        proc.send_signal(signal.SIGHUP)
        line = proc.stderr.readline()
        while "rejected" not in line and line:
            line = proc.stderr.readline()
        assert "policy reload rejected, version 2 stays active" in line and "not_a_key: unknown key" in line
        assert _health(port)["policy_version"] == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        rest = proc.stderr.read()
        assert USER_KEY not in rest and hash_key(USER_KEY) not in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.chmod(tmp_path / "keys.yaml", 0o600)
