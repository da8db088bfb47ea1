"""The `pdfleet:` section of invoke.yaml, read in one place: the defaults every task starts from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from invoke import Context

from pdfleet.errors import ValidationError

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILE = "invoke.yaml"


def repo_path(value: str | Path) -> Path:
    """A path from config or an option: relative paths are taken from the repo root."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


@dataclass(frozen=True)
class Settings:
    """Defaults for every task (invoke.yaml's `pdfleet:`; override with `invoke -f FILE` or
    INVOKE_PDFLEET_* environment variables)."""

    inventory: Path  # the default inventory: the local lab
    profiles_dir: Path
    templates_dir: Path
    output_dir: Path  # render output, reports, benchmark results
    known_hosts: str  # for hosts without the inventory var pdfleet_known_hosts_file
    connect_timeout: float

    @classmethod
    def of(cls, ctx: Context) -> Settings:
        """The settings of this invocation; a missing or mistyped key is an error naming it."""
        section: Any = ctx.config.get("pdfleet", None)
        if not hasattr(section, "get"):
            raise ValidationError(f"{CONFIG_FILE}: no `pdfleet:` section (see the one in this repo)")

        def value(key: str) -> Any:
            found = section.get(key, None)
            if found is None or found == "":
                raise ValidationError(f"{CONFIG_FILE}: pdfleet.{key}: required key is missing")
            return found

        timeout = value("connect_timeout")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValidationError(
                f"{CONFIG_FILE}: pdfleet.connect_timeout: must be a positive number "
                f"of seconds (got {timeout!r})"
            )
        return cls(
            inventory=repo_path(str(value("inventory"))),
            profiles_dir=repo_path(str(value("profiles_dir"))),
            templates_dir=repo_path(str(value("templates_dir"))),
            output_dir=repo_path(str(value("output_dir"))),
            known_hosts=str(Path(str(value("known_hosts"))).expanduser()),
            connect_timeout=float(timeout),
        )


def inventory_name(given: str | None, settings: Settings) -> str:
    """An inventory as a plan names it (and `invoke rebalance --to-plan` checks it): its path from the repo
    root, so another clone of the repo names it the same (absolute when it is outside the repo)."""
    path = (repo_path(given) if given else settings.inventory).resolve()
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)
