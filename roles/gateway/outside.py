"""The profile's outside aliases (`gateway.outside`) on a gateway host: their routes in the policy and
their key files beside it.

Each alias's key comes from its file on the control machine (read by `pdfleet.fleet.secrets`, never
generated) and lands in `<config dir>/outside-<alias>.key`, 0600, owned by the service user, written as a
secret file (never in a diff, a command line or a log); the policy names that file, and the gateway sends
the key to that provider only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.fleet.render import RenderedFile
from pdfleet.model.outside import OutsideAlias


def key_path(config_dir: str, alias: str) -> str:
    """Where an outside alias's key lives on the gateway host (the alias is one path segment)."""
    return f"{config_dir}/outside-{alias}.key"


def outside_routes(
    outside: Mapping[str, OutsideAlias], served: Collection[str], config_dir: str
) -> dict[str, dict[str, Any]]:
    """The policy's route of each outside alias; ValidationError for one that a served model has too."""
    taken = sorted(set(outside) & set(served))
    if taken:
        raise ValidationError(
            f"gateway.outside.{taken[0]}: the alias is also a served model's alias; aliases must be unique"
        )
    return {
        alias: {
            "outside": {"api": o.api, "base_url": o.base_url, "key_file": key_path(config_dir, alias)},
            "upstream_model": o.upstream_model,
        }
        for alias, o in outside.items()
    }


def outside_files(keys: Mapping[str, str], config_dir: str, owner: str) -> list[RenderedFile]:
    """One 0600 secret file per outside alias, holding its key."""
    return [
        RenderedFile(
            key_path(config_dir, alias), key + "\n", mode="0600", secret=True, owner=owner, group=owner
        )
        for alias, key in keys.items()
    ]
