"""`invoke profiles`: validate every profile of a directory (optionally against an inventory), one
status line each, with every problem a profile has."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import Inventory
from pdfleet.model.inventory_checks import check_against_inventory
from pdfleet.model.profile import KVTransferSpec, VllmSpec
from pdfleet.model.profile_loader import list_profiles, load_profile, raw_profile
from pdfleet.model.tls import tls_warnings
from pdfleet.model.weights_checks import weights_warnings


@dataclass(frozen=True)
class ProfileStatus:
    """One line of `invoke profiles`: what a profile is and every problem it has (empty = valid)."""

    name: str
    topology: str
    engine: str
    connector: str
    vllm: str
    problems: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # `file: key.path: message` lines that do not make it invalid

    @property
    def ok(self) -> bool:
        """True when the profile validated (and fitted the inventory, if one was given)."""
        return not self.problems


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    """A mapping section of a raw profile; {} when it is absent or not a mapping."""
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def survey_profiles(
    profiles_dir: Path, inventory: Inventory | None = None, names: Iterable[str] | None = None
) -> list[ProfileStatus]:
    """Validate each listed profile (or every one in the directory), optionally against an inventory."""
    default_engine = VllmSpec.model_fields["engine"].default
    default_connector = KVTransferSpec.model_fields["connector"].default
    statuses = []
    for name in list(names) if names is not None else list_profiles(profiles_dir):
        warnings: tuple[str, ...] = ()
        try:
            profile = load_profile(name, profiles_dir)
            warnings = tuple(
                f"{profile.origin_of(w.path)}: {w.path}: {w.message}" for w in weights_warnings(profile)
            ) + tuple(
                f"{profile.origin_of('gateway.tls')}: gateway.tls: {w}"
                for w in tls_warnings(profile.gateway.tls)
            )
            if inventory is not None:
                check_against_inventory(profile, inventory)
            problems: tuple[str, ...] = ()
        except ValidationError as exc:
            problems = tuple(getattr(exc, "problems", None) or [str(exc)])
        raw = raw_profile(name, profiles_dir)
        kv = _section(raw, "kv_transfer")
        vllm = _section(raw, "vllm")
        topology = str(raw.get("topology", "?"))
        engine = str(vllm.get("engine", default_engine)) if raw else "?"  # unreadable: nothing to show
        connector = str(kv.get("connector", default_connector)) if raw else "?"
        statuses.append(
            ProfileStatus(
                name=name,
                topology=topology,
                engine=engine,
                connector="-" if topology == "colocated" else connector,
                vllm=str(vllm.get("version", "?")),
                problems=problems,
                warnings=warnings,
            )
        )
    return statuses
