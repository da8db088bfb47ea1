"""Python venvs: the installed-distributions fact and the PipRequirements operation."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from pdfleet.ops.base import Change, Fact, FactSource, Handler, Operation, Run
from pdfleet.ops.errors import FactError, OperationError

q = shlex.quote


def canonical_pip_name(name: str) -> str:
    """PEP 503 normalized project name, so `Foo_Bar` and `foo-bar` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


_EGG_PY = re.compile(r"-py\d+(\.\d+)*$")


def parse_metadata_dirs(stdout: str) -> dict[str, str]:
    """Installed-distribution directory names, one a line (`NAME-VERSION.dist-info`, or setuptools'
    `NAME-VERSION[-pyX.Y].egg-info`) → {canonical name: version}. The name part never holds `-` after
    escaping and a PEP 440 version never does, so the last `-` splits them; versionless names are skipped."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        entry = line.strip()
        for suffix in (".dist-info", ".egg-info"):
            if entry.endswith(suffix):
                stem = entry[: -len(suffix)]
                stem = _EGG_PY.sub("", stem) if suffix == ".egg-info" else stem
                name, sep, version = stem.rpartition("-")
                if sep and name and version:
                    found[canonical_pip_name(name)] = version
    return found


@dataclass(frozen=True)
class PipList(Fact[dict[str, str] | None]):
    """Distributions installed in a venv {canonical name: version}; None when the venv has no python.

    Read from the names of the venv's `*.dist-info`/`*.egg-info` directories (what `pip list` reads
    too, from their METADATA) with shell builtins only: no Python start-up on the host per run.
    """

    venv: str

    def command(self) -> str:
        root = self.venv.rstrip("/")
        py = shlex.quote(f"{root}/bin/python")
        site = shlex.quote(f"{root}/lib") + "/python*/site-packages/"
        return (
            f"[ -x {py} ] || exit 3; for d in {site}*.dist-info {site}*.egg-info; do "
            '[ -e "$d" ] && printf \'%s\\n\' "${d##*/}"; done; true'
        )

    def parse(self, stdout: str, rc: int) -> dict[str, str] | None:
        if rc == 3:
            return None
        if rc != 0:
            raise FactError(f"listing the distributions in {self.venv} failed (exit {rc})")
        return parse_metadata_dirs(stdout)


@dataclass(frozen=True)
class PipRequirements(Operation):
    """Requirements (pins like `vllm==0.8.5`) installed in a venv, created first when missing.

    `index_url`/`extra_index_urls` select a mirror; they must not embed credentials (they appear
    on the host's command line): put authenticated indexes in a secret pip.conf File instead.
    """

    venv: str
    requirements: tuple[str, ...]
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    trusted_host: str | None = None
    find_links: tuple[str, ...] = ()
    python: str = "python3"
    system_site_packages: bool = False
    extra_args: tuple[str, ...] = ()
    notify: tuple[Handler, ...] = ()  # e.g. restarts of the units running from this venv

    def __post_init__(self) -> None:
        reqs = (self.requirements,) if isinstance(self.requirements, str) else tuple(self.requirements)
        object.__setattr__(self, "requirements", reqs)
        object.__setattr__(self, "extra_index_urls", tuple(self.extra_index_urls))
        object.__setattr__(self, "find_links", tuple(self.find_links))
        for req in self.requirements:
            try:
                Requirement(req)
            except InvalidRequirement as exc:
                raise OperationError(f"pip requirement {req!r} for {self.venv} is invalid: {exc}") from exc

    def describe(self) -> str:
        return f"pip in {self.venv}: {', '.join(self.requirements)}"

    def facts(self) -> Iterable[Fact[Any]]:
        return (PipList(self.venv),)

    def pip_options(self) -> list[str]:
        """Index/mirror options for pip install."""
        opts: list[str] = []
        if self.index_url:
            opts += ["--index-url", q(self.index_url)]
        for url in self.extra_index_urls:
            opts += ["--extra-index-url", q(url)]
        if self.trusted_host:
            opts += ["--trusted-host", q(self.trusted_host)]
        for link in self.find_links:
            opts += ["--find-links", q(link)]
        return opts + [q(a) for a in self.extra_args]

    def plan(self, facts: FactSource) -> list[Change]:
        installed = facts.get(PipList(self.venv))
        changes: list[Change] = []
        if installed is None:
            site = " --system-site-packages" if self.system_site_packages else ""
            cmd = f"{q(self.python)} -m venv{site} {q(self.venv)}"
            changes.append(Change(self.describe(), f"create venv {self.venv}", (Run(cmd),)))
            installed = {}
        missing = unmet_requirements(self.requirements, installed)
        if missing:
            lines = [f"install into {self.venv}:"]
            for req, have in missing:
                lines.append(f"  + {req}" + (f" (have {have})" if have else ""))
            pip = f"{q(self.venv.rstrip('/') + '/bin/python')} -m pip install --disable-pip-version-check -q"
            cmd = " ".join([pip, *self.pip_options(), *(q(r) for r, _ in missing)])
            changes.append(Change(self.describe(), "\n".join(lines), (Run(cmd),), self.notify))
        return changes


def unmet_requirements(
    requirements: Iterable[str], installed: dict[str, str]
) -> list[tuple[str, str | None]]:
    """(requirement, installed version or None) for each requirement the venv does not satisfy."""
    unmet: list[tuple[str, str | None]] = []
    for text in requirements:
        req = Requirement(text)
        have = installed.get(canonical_pip_name(req.name))
        if have is None:
            unmet.append((text, None))
        elif req.specifier and not req.specifier.contains(have, prereleases=True):
            unmet.append((text, have))
    return unmet
