"""Loopback process helpers: ports, readiness waits that fail early, pinning, keep-awake, stopping."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdfleet.bench.procs import free_port, keep_awake, pin, stop_processes, wait_http, wait_port
from tests.unit.bench.helpers import text_server

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_free_port_can_be_bound() -> None:
    """The port is free on 127.0.0.1 right after."""
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_wait_port_returns_once_something_listens_and_times_out_otherwise() -> None:
    """A listening socket: at once; nothing: TimeoutError after the timeout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        wait_port(s.getsockname()[1], timeout=5.0)
    with pytest.raises(TimeoutError, match="nothing listening"):
        wait_port(free_port(), timeout=0.2)


def test_wait_port_fails_early_when_the_process_exited() -> None:
    """The process that should listen is gone: RuntimeError with its exit code, not a long wait."""
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_port(free_port(), timeout=30.0, proc=proc)


def test_wait_http_needs_a_200(tmp_path: Path) -> None:
    """/health answering 200: returns; a 404 until the timeout: TimeoutError; a dead process: its log."""
    with text_server({"/health": "ok"}) as url:
        wait_http(url + "/health", timeout=5.0)
        with pytest.raises(TimeoutError, match="did not answer"):
            wait_http(url + "/missing", timeout=0.2)
    log = tmp_path / "log"
    log.write_text("boom: bad option\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])
    proc.wait()
    with pytest.raises(RuntimeError, match="(?s)exited with 2.*boom: bad option"):
        wait_http(f"http://127.0.0.1:{free_port()}/health", timeout=30.0, proc=proc, log=log)


def test_pin_pins_a_child_to_one_cpu() -> None:
    """pin(cpu) as preexec_fn: the child may run on that CPU only; pin(None): no preexec_fn."""
    assert pin(None) is None
    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        preexec_fn=pin(cpu),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"[{cpu}]"


def test_keep_awake_spins_at_idle_priority_on_its_cpu() -> None:
    """The spinner runs SCHED_IDLE (it never takes CPU from real work), pinned to the CPU given."""
    cpu = min(os.sched_getaffinity(0))
    spinner = keep_awake(cpu)
    try:
        deadline = time.monotonic() + 10
        while os.sched_getscheduler(spinner.pid) != os.SCHED_IDLE:
            assert time.monotonic() < deadline, "the spinner never went SCHED_IDLE"
            time.sleep(0.01)
        assert os.sched_getaffinity(spinner.pid) == {cpu}
    finally:
        stop_processes([spinner])
    assert spinner.returncode is not None


def test_stop_processes_terminates_and_kills_what_ignores_sigterm() -> None:
    """SIGTERM to each; one that ignores it is SIGKILLed after the timeout."""
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
    # 5 s for the polite one to exit on SIGTERM: niced beside the lab, it may get no CPU for seconds
    stop_processes([polite, stubborn], timeout=5)
    stubborn.wait(5)
    assert polite.returncode == -15 and stubborn.returncode == -9
