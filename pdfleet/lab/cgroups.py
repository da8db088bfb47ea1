"""A cgroup of its own for each lab host's container.

systemd-nspawn with `--keep-unit` and `--register=no` boots the container in the cgroup it was started in,
and the container's systemd takes that cgroup as its root. Started from this machine's root cgroup, every
host got the same one (`/payload`), so the hosts' systemd managers shared every unit's cgroup
(`/payload/system.slice/<unit>`): one host's boot or stop could remove the cgroup another host's unit was
joining, which failed that unit with status 219/CGROUP (a CI run's lab-d1 kept /run/nologin after
systemd-user-sessions failed so). Each host now starts in `pdfleet-lab/<host>` of every hierarchy a
systemd uses, as the unit tests' private systemd does.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "pdfleet-lab"


def systemd_hierarchies(root: Path = CGROUP_ROOT) -> list[Path]:
    """Each cgroup hierarchy a systemd would use: v1's name=systemd and the unified one of a hybrid
    layout, or the v2 root ([] where there is none)."""
    candidates = [root / "systemd", root / "unified"] if (root / "systemd").is_dir() else [root]
    return [h for h in candidates if (h / "cgroup.procs").exists()]


def host_cgroups(name: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The host's cgroup in each hierarchy a systemd would use."""
    return [h / PARENT / name for h in systemd_hierarchies(root)]


def fresh_host_cgroups(name: str, root: Path = CGROUP_ROOT) -> list[Path]:
    """The host's cgroups, emptied of what a container before it left, and created."""
    groups = host_cgroups(name, root)
    for group in groups:
        remove_cgroup(group)
        group.mkdir(parents=True, exist_ok=True)
    return groups


def remove_cgroup(group: Path) -> None:
    """Remove a cgroup and the ones under it, deepest first (one still holding a process stays)."""
    if not group.is_dir():
        return
    for path in sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        group.rmdir()


def joined(groups: list[Path], argv: list[str]) -> list[str]:
    """argv run by a shell that first moves itself into each group (then execs, keeping its pid)."""
    moves = "".join(f'echo $$ > "{g}/cgroup.procs" && ' for g in groups)
    return ["sh", "-c", f'{moves}exec "$@"', "sh", *argv] if groups else argv
