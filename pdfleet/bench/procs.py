"""Helpers for the processes a bench or test runs on loopback: free ports, readiness, CPU pinning, stopping.

Defined once here for the benches, the simulator launchers (`pdfleet.bench.launch`) and the tests.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _exited(proc: subprocess.Popen[bytes] | None, what: str, log: Path | None) -> None:
    """Fail early when the process that should answer has already exited (with its log's tail)."""
    if proc is not None and proc.poll() is not None:
        text = log.read_text() if log else ""
        raise RuntimeError(f"process exited with {proc.returncode} before {what}:\n{text[-3000:]}")


def wait_http(
    url: str,
    timeout: float = 20.0,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Poll url until it answers 200 (an https one verified with `tls`); fail early (with the log) if proc
    exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _exited(proc, f"{url} answered", log)
        try:
            with urllib.request.urlopen(url, timeout=1, context=tls) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    text = log.read_text() if log else ""
    raise TimeoutError(f"{url} did not answer within {timeout}s:\n{text[-3000:]}")


def wait_port(port: int, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:port; fail early if proc exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _exited(proc, f"127.0.0.1:{port} listened", None)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout} s")


def pin(cpu: int | None) -> Callable[[], None] | None:
    """A preexec_fn pinning a child to one CPU (None: no pinning)."""
    if cpu is None:
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


# SCHED_IDLE: the scheduler runs it only when nothing else wants the core, and preempts it at once.
_SPIN = "import os\nos.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass\n"


def keep_awake(cpu: int) -> subprocess.Popen[bytes]:
    """A lowest-priority busy loop pinned to `cpu`, so that a VM never halts that vCPU.

    A halted vCPU takes up to milliseconds (an IPI through the hypervisor) to wake, which lands in the
    latency tail of whatever runs there; the spinner takes no CPU from real work.
    """
    return subprocess.Popen([sys.executable, "-c", _SPIN], preexec_fn=pin(cpu))


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 15.0) -> None:
    """SIGTERM every process (last started first), then wait for each; SIGKILL one that does not exit."""
    for proc in reversed(procs):
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
