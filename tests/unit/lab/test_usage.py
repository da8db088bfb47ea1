"""CPU of a PID namespace's processes, reaped children included, on this machine's own namespace."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pdfleet.lab.usage import _stat_cpu_ticks, namespace_cpu_seconds

pytestmark = pytest.mark.procs  # starts real processes: see tests/unit/conftest.py


def test_stat_fields_after_a_name_with_spaces_and_parens() -> None:
    line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 11 13 20 0 1 0 5 0 0"
    assert _stat_cpu_ticks(line) == 7 + 3 + 11 + 13


def test_a_reaped_childs_cpu_counts_in_its_namespace() -> None:
    me = os.getpid()
    before = namespace_cpu_seconds([me])[me]
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass",
        ],
        check=True,
    )
    after = namespace_cpu_seconds([me])[me]
    assert after - before >= 0.25
    assert namespace_cpu_seconds([2**22 + 12345]) == {}  # no such process: nothing to report
