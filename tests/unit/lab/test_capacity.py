"""Whether a lab fits: memory per host against MemAvailable, refused with the numbers before booting."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdfleet.lab.capacity import HOST_MEMORY_MIB, RESERVE_MIB, available_mib, memory_problem


def test_fits_or_says_how_many_would() -> None:
    assert memory_problem("inv.yml", 16, 16 * HOST_MEMORY_MIB + RESERVE_MIB) is None
    assert memory_problem("inv.yml", 0, 0) is None  # every host already running
    problem = memory_problem("inventory/lab-16.yml", 16, RESERVE_MIB + 3 * HOST_MEMORY_MIB + 10)
    assert problem is not None
    assert problem.startswith("inventory/lab-16.yml: 16 lab hosts to boot need about ")
    assert "room for 3 more" in problem and "MemAvailable" in problem


def test_available_memory_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemAvailable:    2097152 kB\n")
    assert available_mib(meminfo) == 2048
    assert available_mib() > 0  # this machine's
    meminfo.write_text("MemTotal: 1 kB\n")
    with pytest.raises(ValueError, match="no MemAvailable"):
        available_mib(meminfo)
