"""Whether a lab fits this machine: memory per host against what the kernel says is available."""

from __future__ import annotations

from pathlib import Path

# A provisioned lab host, measured: systemd, journald, sshd, logind and dbus plus one or two simulators
# (pool hosts, ~110 MiB RSS) or the gateway and vllm-router (~210 MiB); pip installs peak above that.
HOST_MEMORY_MIB = 256
# Left for the control side while the hosts run: provision, the mirror servers, tests.
RESERVE_MIB = 1024


def available_mib(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable in MiB (the kernel's estimate of memory usable without swapping)."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise ValueError(f"{meminfo} has no MemAvailable line")


def memory_problem(where: str, booting: int, available: int) -> str | None:
    """Why booting `booting` more hosts would not fit in `available` MiB, or None when it fits."""
    need = booting * HOST_MEMORY_MIB + RESERVE_MIB
    if booting == 0 or need <= available:
        return None
    fits = max(0, (available - RESERVE_MIB) // HOST_MEMORY_MIB)
    return (
        f"{where}: {booting} lab hosts to boot need about {need} MiB ({HOST_MEMORY_MIB} MiB each plus "
        f"{RESERVE_MIB} MiB for the control side), but only {available} MiB is available "
        f"(MemAvailable); room for {fits} more. Use an inventory with fewer hosts or free memory."
    )
