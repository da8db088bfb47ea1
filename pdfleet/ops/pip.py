"""Python venvs: the installed-distributions fact and the PipRequirements operation."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement

from pdfleet.ops.base import Change, Fact, FactSource, Handler, Operation, Run
from pdfleet.ops.errors import FactError, OperationError

q = shlex.quote


def canonical_pip_name(name: str) -> str:
    """PEP 503 normalized project name, so `Foo_Bar` and `foo-bar` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pip_list_json(stdout: str) -> dict[str, str]:
    """`pip list --format=json` → {canonical name: version}."""
    try:
        rows = json.loads(stdout or "[]")
    except json.JSONDecodeError as exc:
        raise FactError(f"pip list did not print JSON: {stdout.strip()[:200]!r}") from exc
    return {canonical_pip_name(row["name"]): str(row["version"]) for row in rows}


@dataclass(frozen=True)
class PipList(Fact[dict[str, str] | None]):
    """Distributions installed in a venv {canonical name: version}; None when the venv has no python."""

    venv: str

    def command(self) -> str:
        py = shlex.quote(f"{self.venv.rstrip('/')}/bin/python")
        return (
            f"[ -x {py} ] || exit 3; "
            f"{py} -m pip list --format=json --disable-pip-version-check --no-input 2>/dev/null"
        )

    def parse(self, stdout: str, rc: int) -> dict[str, str] | None:
        if rc == 3:
            return None
        if rc != 0:
            raise FactError(f"pip list in {self.venv} failed (exit {rc}); is pip installed in the venv?")
        return parse_pip_list_json(stdout)


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
