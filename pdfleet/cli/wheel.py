"""`invoke wheel`: the host wheel (what gateway and simulator hosts install), its version or the file."""

from __future__ import annotations

from invoke import Context, task

from pdfleet.cli.exits import user_errors
from pdfleet.cli.settings import repo_path
from pdfleet.fleet.host_wheel import DEFAULT_CACHE


@task(
    help={
        "print_version": "Only print the host wheel's version for the current tree (nothing is written).",
        "out": f"Write the wheel into this directory (default: the provision cache, {DEFAULT_CACHE}).",
    }
)
@user_errors
def wheel(ctx: Context, print_version: bool = False, out: str | None = None) -> None:
    """Build the host wheel of this tree; its version changes only when host code (gateway, sim) does."""
    from pdfleet.fleet.host_wheel import cached_host_wheel, host_version, write_host_wheel

    if print_version:
        print(host_version())
        return
    path = write_host_wheel(repo_path(out)) if out else cached_host_wheel()
    print(path)
