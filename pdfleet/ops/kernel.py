"""Kernel modules: the loaded-modules fact and the KernelModule operation (load, persist, blacklist)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pdfleet.ops.base import Change, Fact, FactSource, Operation, Run, relabel
from pdfleet.ops.errors import FactError
from pdfleet.ops.files import File, FileState

q = shlex.quote


def module_name(name: str) -> str:
    """The kernel's spelling of a module name: modprobe accepts dashes, /proc/modules shows underscores."""
    return name.strip().replace("-", "_")


def parse_proc_modules(stdout: str) -> frozenset[str]:
    """Loaded module names from /proc/modules (first column)."""
    return frozenset(module_name(line.split()[0]) for line in stdout.splitlines() if line.strip())


@dataclass(frozen=True)
class LoadedModules(Fact[frozenset[str]]):
    """Names of loaded kernel modules (underscore spelling); empty on a kernel without module support."""

    def command(self) -> str:
        # containers and monolithic kernels have no /proc/modules: nothing is loaded as a module
        return "[ -e /proc/modules ] || exit 0; cat /proc/modules"

    def parse(self, stdout: str, rc: int) -> frozenset[str]:
        if rc != 0:
            raise FactError(f"cannot read /proc/modules (exit {rc})")
        return parse_proc_modules(stdout)


@dataclass(frozen=True)
class KernelModule(Operation):
    """A kernel module loaded (and at boot) with options, or unloaded (and optionally blacklisted)."""

    name: str
    present: bool = True
    persist: bool = True
    options: str | None = None  # "k=v k2=v2", written to /etc/modprobe.d; applies at next load
    blacklist: bool = False  # with present=False: never auto-load it

    def describe(self) -> str:
        return f"kernel module {self.name}{'' if self.present else ' (absent)'}"

    def facts(self) -> Iterable[Fact[Any]]:
        paths = [self.load_path]
        if self.present and self.options is not None:
            paths.append(f"/etc/modprobe.d/pdfleet-{self.name}.conf")
        if not self.present and self.blacklist:
            paths.append(f"/etc/modprobe.d/blacklist-pdfleet-{self.name}.conf")
        return (LoadedModules(), *(FileState(p) for p in paths))

    @property
    def load_path(self) -> str:
        """The modules-load.d file that loads it at boot."""
        return f"/etc/modules-load.d/{self.name}.conf"

    def plan(self, facts: FactSource) -> list[Change]:
        loaded = module_name(self.name) in facts.get(LoadedModules())
        changes: list[Change] = []
        load_path = self.load_path
        if self.present:
            if self.options is not None:
                content = f"options {self.name} {self.options}\n"
                changes += File(f"/etc/modprobe.d/pdfleet-{self.name}.conf", content).plan(facts)
            if not loaded:
                load = Run(f"modprobe {q(self.name)}")
                changes.append(Change(self.describe(), f"load {self.name}", (load,)))
            if self.persist:
                changes += File(load_path, f"{self.name}\n").plan(facts)
        else:
            if loaded:
                cmd = f"modprobe -r {q(self.name)}"
                changes.append(Change(self.describe(), f"unload {self.name}", (Run(cmd),)))
            if facts.get(FileState(load_path)) is not None:
                diff = f"remove {load_path}"
                changes.append(Change(self.describe(), diff, (Run(f"rm -f {q(load_path)}"),)))
            if self.blacklist:
                content = f"blacklist {self.name}\n"
                changes += File(f"/etc/modprobe.d/blacklist-pdfleet-{self.name}.conf", content).plan(facts)
        return relabel(changes, self.describe())
