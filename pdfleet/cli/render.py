"""`invoke render`: write exactly what provision would install, for review, without touching a host and
without writing anything outside `--out` (a gateway key provision would generate is a placeholder)."""

from __future__ import annotations

from pathlib import Path

from invoke import Context, task

from pdfleet.cli.exits import user_errors
from pdfleet.cli.options import HELP, layout_note, open_deployment
from pdfleet.cli.settings import Settings, repo_path
from pdfleet.errors import ValidationError


@task(
    positional=[],  # `invoke TASK --help` is help, not a profile named --help
    help={
        "profile": HELP["profile"],
        "inventory": HELP["inventory"],
        "out": "Output directory; files land at OUT/<host>/<absolute path> (default: out/render).",
        "limit": HELP["limit"],
    },
)
@user_errors
def render(
    ctx: Context, profile: str, inventory: str | None = None, out: str | None = None, limit: str | None = None
) -> None:
    """Render units, env files and configs per host into a directory to review or diff."""
    from pdfleet.fleet.provision import render_fleet
    from pdfleet.fleet.render import write_tree

    dest = out_dir(repo_path(out) if out else Settings.of(ctx).output_dir / "render")
    deployment = open_deployment(ctx, profile, inventory, limit=limit, keys="review")
    hosts = deployment.hosts
    written = write_tree(render_fleet(deployment, hosts), dest)
    for path in written:
        print(path.relative_to(dest))
    print(f"{len(written)} files for {len(hosts)} hosts under {dest}")
    print(layout_note(ctx, profile, inventory))
    keys = deployment.gateway_secrets
    if keys is not None and keys.tls is not None and keys.tls.placeholders:
        files = ", ".join(str(p) for p in keys.tls.placeholders)
        print(
            f"placeholders used for the site's TLS files ({files}: missing); provision refuses without them"
        )
    if keys is not None and keys.placeholders:
        print(placeholder_note(keys.placeholders))
        unset = keys.unset_outside()
        if unset:
            print(
                f"outside aliases without their key file: {', '.join(unset)}; provision never generates "
                "those: put each provider's key in its gateway.outside.<alias>.key_file (chmod 600) first"
            )


def placeholder_note(missing: tuple[Path, ...]) -> str:
    """Why some rendered key hashes (and the controller's key file) will differ from provision's."""
    files = ", ".join(str(p) for p in missing)
    return (
        f"placeholders used for the gateway keys provision would generate ({files}: not created); the "
        "rendered key hashes and controller key file differ from what provision installs"
    )


def out_dir(path: Path) -> Path:
    """`--out`: a directory, or a path that can become one (checked before anything is read or written)."""
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        where = "is a file" if existing == path else f"is below the file {existing}"
        raise ValidationError(f"--out {path}: {where}, not a directory")
    return path
