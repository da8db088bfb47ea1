"""CPU accounting: this process's and its children's CPU seconds, the machine's busy time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pdfleet.bench.cpu import busy_cpu_seconds, cpu_seconds, own_cpu_seconds, process_tree

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def _spin(seconds: float) -> None:
    end = own_cpu_seconds() + seconds
    while own_cpu_seconds() < end:
        pass


def test_cpu_seconds_grow_with_work_and_a_gone_process_counts_zero() -> None:
    """/proc's utime + stime: more after spinning on the CPU; a pid that is gone adds nothing."""
    before, busy = cpu_seconds([os.getpid()]), busy_cpu_seconds()
    _spin(0.05)
    assert cpu_seconds([os.getpid()]) > before
    assert busy_cpu_seconds() > busy
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert cpu_seconds([proc.pid]) == 0.0
    # this process keeps running between reads (its clock ticks at 10 ms): bracket the sum
    alone = cpu_seconds([os.getpid()])
    summed = cpu_seconds([os.getpid(), proc.pid])
    assert alone <= summed <= cpu_seconds([os.getpid()])


def test_own_cpu_seconds_agrees_with_proc() -> None:
    """rusage and /proc count the same CPU (to /proc's tick)."""
    _spin(0.05)
    assert abs(own_cpu_seconds() - cpu_seconds([os.getpid()])) < 0.05


def test_process_tree_is_the_pid_and_its_children() -> None:
    """nginx's master and workers: here this process and two children, not a grandchild's parent."""
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) for _ in range(2)]
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid()
        assert {k.pid for k in kids} <= set(tree)
    finally:
        for k in kids:
            k.kill()
            k.wait()
