"""CPU time accounting from /proc and rusage: what each process of a benchmark, and the machine, spent."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime of these processes, in seconds (a process that is gone counts 0)."""
    total = 0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / CLK_TCK


def busy_cpu_seconds() -> float:
    """CPU seconds all CPUs spent busy (/proc/stat: everything but idle and iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def own_cpu_seconds() -> float:
    """This process's own CPU seconds (user + system), at rusage's finer resolution."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def process_tree(pid: int) -> list[int]:
    """pid and its direct children (nginx: master plus workers)."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids
