"""Jinja2 rendering of templates/ and the on-disk layout `invoke render` writes for review."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from pdfleet.errors import PdfleetError, ValidationError
from pdfleet.model.yamlfile import control_character
from pdfleet.ops.systemd import env_value, systemd_command


@dataclass(frozen=True)
class RenderedFile:
    """A file a role installs: where, what, and with which mode and owner."""

    path: str
    content: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    secret: bool = False


class Renderer:
    """Renders templates/ with StrictUndefined, so a missing variable is an error, not an empty string."""

    def __init__(self, templates_dir: Path) -> None:
        self._env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(templates_dir)),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
        )
        self._env.filters["systemd_command"] = systemd_command
        self._env.filters["env_value"] = env_value
        self._env.filters["shquote"] = shlex.quote
        self._env.filters["unit_text"] = unit_text

    def render(self, template: str, **variables: Any) -> str:
        """The template rendered; refuses a variable holding a control character (validation keeps them out
        of profiles and inventories; this keeps any other source from adding a line to a file)."""
        for name, value in variables.items():
            char = _control_in(value)
            if char:
                raise ValidationError(
                    f"{template}: {name}: contains the control character {char}; "
                    "refusing to render it into a file"
                )
        return self._env.get_template(template).render(**variables)


def unit_text(value: Any) -> str:
    """Free text for a unit file setting (Description=): `%` doubled, so systemd shows it instead of
    reading a specifier."""
    return str(value).replace("%", "%%")


def _control_in(value: Any) -> str | None:
    """The first control character in a string, or in the strings of a list, tuple or mapping."""
    if isinstance(value, str):
        return control_character(value)
    if isinstance(value, Mapping):
        return next((c for item in value.items() for part in item if (c := _control_in(part))), None)
    if isinstance(value, list | tuple):
        return next((c for item in value if (c := _control_in(item))), None)
    return None


def tree_paths(
    files_by_host: Mapping[str, Iterable[RenderedFile]], out_dir: Path
) -> list[tuple[Path, RenderedFile]]:
    """Where each host's files go under out_dir (`<host>/<absolute path>`); refuses any that would land
    outside out_dir/<host> (a host name or path with `..` or `/`, or a symlink on the way), before
    anything is written."""
    root = out_dir.resolve()
    planned = []
    for host, files in files_by_host.items():
        host_root = (root / host).resolve()
        for rendered in files:
            dest = out_dir / host / rendered.path.lstrip("/")
            if host_root.parent != root or not dest.resolve().is_relative_to(host_root):
                raise ValidationError(
                    f"{host}: {rendered.path}: would be written outside {out_dir}/<host>; refusing to render"
                )
            planned.append((dest, rendered))
    return planned


def write_tree(files_by_host: Mapping[str, Iterable[RenderedFile]], out_dir: Path) -> list[Path]:
    """Write each host's files under out_dir/<host>/<absolute path>, with their modes; returns the paths."""
    written = []
    for dest, rendered in tree_paths(files_by_host, out_dir):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            _write_with_mode(dest, rendered.content, int(rendered.mode, 8))
        except OSError as exc:
            raise PdfleetError(f"{dest}: cannot write: {exc.strerror or exc}") from None
        written.append(dest)
    return written


def _write_with_mode(dest: Path, content: str, mode: int) -> None:
    """Write a file that has its final mode before any byte lands: a key file is never readable by others,
    not even for a moment, nor an older copy left with a wider mode."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask, and ignored for a file that exists
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(content)
