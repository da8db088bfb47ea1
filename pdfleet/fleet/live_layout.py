"""The live layout rule: which pool each host serves is fleet state, as the live stage is (issue 35).

The inventory's pool groups are only the initial layout. Once `invoke rebalance` moved a host, the layout it
left is kept on the fleet, beside the live stage: on every gateway host of the inventory (where the
gateway's policy keeps the live stage), in FLEET_LAYOUT_DIR/<profile>.json, with the audit log of the moves
beside it (one JSON line per move, refusal, failure or reset, with its reason). The tasks that change or
check hosts (provision, verify, keys, rebalance) read it from there (pdfleet.fleet.layout_store), so a
plain `invoke provision` from any clone keeps a moved host where it is; `invoke provision
--layout-from-inventory` is the explicit reset. Each read leaves a copy on the control machine (under
pdfleet.output_dir/layouts/), which the tasks that touch no host (render, bench, ...) show, saying so.

Here: the file's text both ways, which layout the gateway hosts agree on, the audit line, the local copy,
and the inventory rewritten to a layout. Nothing here opens a connection.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from pdfleet.errors import ValidationError
from pdfleet.fleet.host_layout import STATE_DIR
from pdfleet.model.inventory import Inventory
from pdfleet.model.served import ServedModel
from pdfleet.model.specs import POOL_NAMES

HostPools = Mapping[str, tuple[str, ...]]  # host -> the pools it serves
FLEET_LAYOUT_DIR = f"{STATE_DIR}/layouts"  # on each gateway host: <profile>.json and <profile>.audit.jsonl
RESET_HINT = "run `invoke provision --layout-from-inventory` to go back to the inventory's layout"


class LiveLayout(BaseModel):
    """The state file: the layout `invoke rebalance` left, for one profile on one inventory."""

    model_config = ConfigDict(extra="forbid")

    profile: str
    inventory: str
    hosts: dict[str, list[str]]


def profile_key(profile: str) -> str:
    """The name a profile's live layout is kept under (a profile path counts by its file's stem)."""
    return Path(profile).stem


def fleet_paths(profile: str, root: str = FLEET_LAYOUT_DIR) -> tuple[str, str]:
    """Where a gateway host keeps a profile's live layout, and its audit log beside it."""
    return f"{root}/{profile_key(profile)}.json", f"{root}/{profile_key(profile)}.audit.jsonl"


def layout_text(profile: str, inventory: Path, hosts: HostPools) -> str:
    """The live layout's file text."""
    live = LiveLayout(
        profile=profile_key(profile), inventory=str(inventory), hosts={h: list(p) for h, p in hosts.items()}
    )
    return json.dumps(live.model_dump(), indent=2) + "\n"


def parse_layout(text: str, source: str) -> HostPools:
    """The layout in a live layout file's text (`source`: where it was read, for the error)."""
    try:
        live = LiveLayout.model_validate(json.loads(text))
    except ValueError as exc:  # bad JSON, or pydantic's ValidationError (a ValueError) on its fields
        raise ValidationError(f"{source}: not a live layout ({exc}); remove it or {RESET_HINT}") from exc
    return {host: tuple(pools) for host, pools in live.hosts.items()}


def agreed_layout(texts: Mapping[str, str | None], path: str) -> HostPools | None:
    """The live layout the gateway hosts keep (`texts`: each one's file text, None where it has none):
    None when none has one; refused when two disagree (a host that has none takes the others' at the next
    move or reset)."""
    kept = {host: parse_layout(text, f"{host}:{path}") for host, text in texts.items() if text is not None}
    distinct = {json.dumps(dict(layout), sort_keys=True) for layout in kept.values()}
    if len(distinct) > 1:
        raise ValidationError(
            f"the gateway hosts {', '.join(kept)} keep different live layouts in {path}; {RESET_HINT}, "
            "or move a host again with `invoke rebalance` (it writes the layout to every gateway host)"
        )
    return next(iter(kept.values()), None)


def audit_line(event: Mapping[str, Any], at: float) -> str:
    """One audit line (a move, a refusal, a failure, a reset) with its time."""
    return json.dumps({"at": round(at, 3), **event}) + "\n"


def copy_file(state_dir: Path, inventory: Path, profile: str) -> Path:
    """Where the control machine keeps its copy of the live layout last read from the fleet."""
    return state_dir / "layouts" / f"{inventory.stem}-{profile_key(profile)}.json"


def read_copy(path: Path) -> HostPools | None:
    """The live layout in the control machine's copy (None: no copy, the inventory's layout applies)."""
    return parse_layout(path.read_text(), str(path)) if path.exists() else None


def write_copy(path: Path, text: str | None) -> None:
    """Keep the copy of a live layout read from the fleet (None: the fleet keeps none, the copy goes);
    written whole to a temporary file, then renamed over the old one."""
    if text is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def apply_layout(inventory: Inventory, spec: ServedModel, hosts: HostPools, source: str) -> Inventory:
    """The inventory with its pool groups rewritten to a live layout (`source`: the state file, for errors).

    Only pools that take their hosts from the inventory group named after them can move: a pool whose
    `hosts:` the profile lists is refused, as are hosts and pools the inventory or the profile lacks.
    """
    unknown = [h for h in hosts if h not in inventory.hosts]
    if unknown:
        raise ValidationError(
            f"{source}: host {', '.join(unknown)} is not in {inventory.source}; {RESET_HINT}"
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
