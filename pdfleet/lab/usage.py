"""What lab hosts cost this machine: CPU time of every process in a host's container, reaped ones too.

A process's utime+stime plus its cutime+cstime (the CPU of the children it waited for, theirs
included) summed over the live processes of a PID namespace counts every process that ever ran in
it and was reaped by one still alive: sshd's listener reaps each session, and the session reaps
the commands it ran, so the CPU an SSH command costs a host shows up as a delta of this sum.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def _stat_cpu_ticks(stat: str) -> int:
    """utime+stime+cutime+cstime from a /proc/PID/stat line (fields 14-17; the name may hold spaces)."""
    fields = stat[stat.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15])


def namespace_cpu_seconds(init_pids: Iterable[int], proc: Path = PROC) -> dict[int, float]:
    """CPU seconds of all processes sharing each init's PID namespace, by init PID (absent: gone)."""
    wanted: dict[str, int] = {}
    for pid in init_pids:
        try:
            wanted[os.readlink(proc / str(pid) / "ns" / "pid")] = pid
        except OSError:
            continue
    ticks = dict.fromkeys(wanted.values(), 0)
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = wanted.get(os.readlink(entry / "ns" / "pid"))
            if owner is not None:
                ticks[owner] += _stat_cpu_ticks((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue  # exited while we looked
    hz = os.sysconf("SC_CLK_TCK")
    return {pid: t / hz for pid, t in ticks.items()}
