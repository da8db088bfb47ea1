"""`invoke profiles`: list every profile and whether it validates (and fits an inventory, if given)."""

from __future__ import annotations

from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

from pdfleet.cli.exits import user_errors
from pdfleet.cli.settings import Settings, repo_path
from pdfleet.errors import ValidationError


@task(
    auto_shortflags=False,
    help={
        "profiles_dir": "Directory of profile YAML files (default: pdfleet.profiles_dir in invoke.yaml).",
        "inventory": "Also run the semantic checks against this inventory (groups, GPU indices, ports).",
        "profile": "Only these profiles, comma-separated (default: every profile in the directory).",
    },
)
@user_errors
def profiles(
    ctx: Context, profiles_dir: str | None = None, inventory: str | None = None, profile: str | None = None
) -> None:
    """List profiles with topology/engine/connector and whether each validates; non-zero exit if any fails."""
    from pdfleet.model.inventory import load_inventory
    from pdfleet.model.survey import survey_profiles

    settings = Settings.of(ctx)
    directory = _shown(repo_path(profiles_dir) if profiles_dir else settings.profiles_dir)
    if not directory.is_dir():
        raise ValidationError(f"{directory}: no such profiles directory")
    inv = None
    if inventory:
        inv = load_inventory(_shown(repo_path(inventory)), known_hosts_default=settings.known_hosts)
    names = [n.strip() for n in profile.split(",") if n.strip()] if profile else None
    statuses = survey_profiles(directory, inv, names)
    if not statuses:
        print(f"no profiles in {directory}")
        return
    rows = [("PROFILE", "TOPOLOGY", "ENGINE", "CONNECTOR", "VLLM", "STATUS")]
    fits = f"ok (fits {inventory})" if inv is not None else "ok"
    rows += [
        (s.name, s.topology, s.engine, s.connector, s.vllm, fits if s.ok else "INVALID") for s in statuses
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for status in statuses:
        if status.warnings:
            print(f"\n{status.name}: warning")
            for warning in status.warnings:
                print(f"  {warning}")
    bad = [s for s in statuses if not s.ok]
    for status in bad:
        print(f"\n{status.name}:")
        for problem in status.problems:
            print(f"  {problem}")
    if bad:
        raise Exit(
            f"\n{len(bad)} of {len(statuses)} profiles invalid: {', '.join(s.name for s in bad)}", code=1
        )


def _shown(path: Path) -> Path:
    """The path relative to the working directory when it is below it, so messages stay short."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path
