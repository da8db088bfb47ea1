"""Jinja2 rendering of templates/ and the on-disk layout `invoke render` writes for review."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

_SYSTEMD_BARE = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


@dataclass(frozen=True)
class RenderedFile:
    """A file a role installs: where, what, and with which mode and owner."""

    path: str
    content: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    secret: bool = False


def systemd_arg(arg: str) -> str:
    """Quote one argv word for ExecStart= so systemd passes it intact (JSON included).

    systemd expands `%` specifiers and `$VAR` in ExecStart and unescapes C-style backslashes inside
    quotes; doubling `%`/`$` and escaping `\\` and `"` keeps the word literal.
    """
    escaped = arg.replace("%", "%%").replace("$", "$$")
    if escaped and _SYSTEMD_BARE.match(escaped):
        return escaped
    if "'" not in escaped and "\\" not in escaped:
        return f"'{escaped}'"  # the readable form for JSON: nothing inside needs escaping
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_command(argv: Iterable[str]) -> str:
    """A whole ExecStart= command line from an argv list."""
    return " ".join(systemd_arg(a) for a in argv)


def env_value(value: Any) -> str:
    """A value for a systemd EnvironmentFile= line (double-quoted when it has spaces or quotes)."""
    text = str(value)
    if re.match(r"^[A-Za-z0-9_@%+=:,./-]*$", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


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

    def render(self, template: str, **variables: Any) -> str:
        return self._env.get_template(template).render(**variables)


def write_tree(files_by_host: Mapping[str, Iterable[RenderedFile]], out_dir: Path) -> list[Path]:
    """Write each host's files under out_dir/<host>/<absolute path>, with their modes; returns the paths."""
    written = []
    for host, files in files_by_host.items():
        for rendered in files:
            dest = out_dir / host / rendered.path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(rendered.content)
            dest.chmod(int(rendered.mode, 8))
            written.append(dest)
    return written
