"""The live layout rule: which pool each host serves is fleet state, as the live stage is (issue 35).

The inventory's pool groups are only the initial layout. Once `invoke rebalance` moved a host, the layout it
left is kept in a state file on the control machine, and every command that builds the deployment sees
the inventory with its pool groups rewritten to that layout: a plain `invoke provision` afterwards keeps
the moved host where it is; `invoke provision --layout-from-inventory` is the explicit reset. Every move is
one line of the audit log beside the state file, with its reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pdfleet.errors import ValidationError
from pdfleet.model.inventory import Inventory
from pdfleet.model.served import ServedModel
from pdfleet.model.specs import POOL_NAMES

HostPools = Mapping[str, tuple[str, ...]]  # host -> the pools it serves


class LiveLayout(BaseModel):
    """The state file: the layout `invoke rebalance` left, for one profile on one inventory."""

    model_config = ConfigDict(extra="forbid")

    profile: str
    inventory: str
    hosts: dict[str, list[str]]


def layout_file(state_dir: Path, inventory: Path, profile: str) -> Path:
    """Where the live layout of a profile on an inventory is kept (its audit log beside it)."""
    name = Path(profile).stem
    return state_dir / "layouts" / f"{inventory.stem}-{name}.json"


def audit_file(layout: Path) -> Path:
    """The audit log of the moves that led to a live layout: one JSON line per move."""
    return layout.with_suffix(".audit.jsonl")


def read_layout(path: Path) -> HostPools | None:
    """The live layout in a state file (None: no file, the inventory's layout applies)."""
    if not path.exists():
        return None
    try:
        live = LiveLayout.model_validate(json.loads(path.read_text()))
    except ValueError as exc:  # bad JSON, or pydantic's ValidationError (a ValueError) on its fields
        raise ValidationError(
            f"{path}: not a live layout ({exc}); remove it or run "
            "`invoke provision --layout-from-inventory` to go back to the inventory's layout"
        ) from exc
    return {host: tuple(pools) for host, pools in live.hosts.items()}


def write_layout(path: Path, profile: str, inventory: Path, hosts: HostPools) -> None:
    """Keep a live layout (written whole to a temporary file, then renamed over the old one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    live = LiveLayout(profile=profile, inventory=str(inventory), hosts={h: list(p) for h, p in hosts.items()})
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(live.model_dump(), indent=2) + "\n")
    tmp.replace(path)


def record(path: Path, event: Mapping[str, Any]) -> None:
    """Append one audit line (a move, a refusal, a reset) with its time to the layout's audit log."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with audit_file(path).open("a") as out:
        out.write(json.dumps({"at": round(time.time(), 3), **event}) + "\n")


def apply_layout(inventory: Inventory, spec: ServedModel, hosts: HostPools, source: Path) -> Inventory:
    """The inventory with its pool groups rewritten to a live layout (`source`: the state file, for errors).

    Only pools that take their hosts from the inventory group named after them can move: a pool whose
    `hosts:` the profile lists is refused, as are hosts and pools the inventory or the profile lacks.
    """
    unknown = [h for h in hosts if h not in inventory.hosts]
    if unknown:
        raise ValidationError(
            f"{source}: host {', '.join(unknown)} is not in {inventory.source}; run "
            "`invoke provision --layout-from-inventory` to go back to the inventory's layout"
        )
    if spec.listed:
        raise ValidationError(
            f"{source}: a live layout moves the hosts of a single-model profile; this one lists models"
        )
    set_pools = dict(spec.pools.items())
    for host, pools in hosts.items():
        for pool in pools:
            if pool not in set_pools:
                raise ValidationError(f"{source}: host {host}: the profile sets no pool {pool!r}")
    listed = [pool for pool, pool_spec in set_pools.items() if pool_spec.hosts is not None]
    if listed:
        raise ValidationError(
            f"{source}: pools.{listed[0]}.hosts lists its hosts in the profile; a live layout moves hosts "
            "between the inventory groups colocated, prefill and decode only"
        )
    groups = dict(inventory.groups)
    for pool in set_pools:
        groups[pool] = tuple(h for h in inventory.hosts if pool in hosts.get(h, ()))
    moved = {
        name: replace(host, groups=_host_groups(host.groups, hosts.get(name, ())))
        for name, host in inventory.hosts.items()
    }
    return Inventory(source=inventory.source, hosts=moved, groups=groups)


def _host_groups(groups: frozenset[str], pools: tuple[str, ...]) -> frozenset[str]:
    """A host's groups with its pool groups replaced by the pools the layout gives it."""
    return frozenset(g for g in groups if g not in POOL_NAMES) | frozenset(pools)
