"""`invoke rebalance --to-plan FILE`, pure: a plan's recommended layout (`invoke plan`'s plan.json) read and
checked against the fleet it is applied to, and the moves that reach its pool counts one host at a time
(issue 35). Nothing here does I/O: pdfleet.fleet.replanning carries the moves out, gated.

The fleet runs one instance of a pool per host, so a plan's pool of n instances at TP t is n hosts serving
that pool, each with the profile's `pools.<pool>` shape. Moving hosts changes only the counts: a plan whose
pools have another TP or token budget than the profile's needs the profile changed first, and a plan made
for another profile, model or inventory (another number of hosts) is refused, each with what to do.

The moves: while a pool has fewer hosts than the plan's, one host moves into it from a pool that has more,
each move checked by the mover (`plan_move`: the host fits the pool's GPUs, its pool keeps its minimum).
The host is chosen deterministically, and the choice says why: a host the inventory puts in the target pool
first (the move takes it back where the inventory had it), then one of the pool with the most hosts over the
plan's count, then the last such host in inventory order (the inventory's first hosts stay where they are).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pdfleet.errors import ValidationError
from pdfleet.fleet.mover import Layout, MovePlan, plan_move
from pdfleet.model.specs import POOL_NAMES

STAGE_OF_KIND = {"colocated": "colocated", "hybrid": "long-prompts", "disagg": "all-disagg"}  # plan.diff's


@dataclass(frozen=True)
class Fleet:
    """What a plan is checked against: the profile, model and inventory it is applied to, each pool's shape
    in the profile (TP, token budget), the gateway's long-prompt threshold and stage."""

    profile: str
    model: str
    inventory: str  # as a plan names it: its path from the repo root (cli.settings.inventory_name)
    shapes: Mapping[str, tuple[int, int]]  # pool -> (tensor_parallel_size, max_num_batched_tokens)
    threshold: int
    stage: str


@dataclass(frozen=True)
class Target:
    """A plan's recommended layout as host counts per pool, and what else it asks that moves do not make."""

    name: str
    counts: Mapping[str, int]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Move:
    """One host moved from one pool to another, and why this host."""

    host: str
    source: str
    target: str
    why: str

    def back(self) -> Move:
        """The move that undoes this one."""
        return Move(
            self.host, self.target, self.source, f"back to {self.source}, where it was before the plan"
        )


def target_of(doc: Mapping[str, Any], where: str, fleet: Fleet) -> Target:
    """The plan's recommended layout as host counts per pool; ValidationError (naming the file and key)
    when the plan has none, was made for another profile, model or inventory, or changes a pool's shape."""
    _same(doc, where, "profile", fleet.profile, "invoke plan --profile")
    _same(doc, where, "model", fleet.model, "invoke plan --model")
    planned = doc.get("inventory")
    if not isinstance(planned, str):
        raise ValidationError(
            f"{where}: inventory: the plan does not say which inventory it was made for (a plan.json from "
            "before `invoke rebalance --to-plan`): run `invoke plan` again"
        )
    if planned != fleet.inventory:
        raise ValidationError(
            f"{where}: inventory: the plan was made for {planned}, not {fleet.inventory}: run `invoke plan "
            f"--inventory {fleet.inventory}` for this fleet"
        )
    row = _recommended(doc, where)
    pools = row.get("pools")
    if not isinstance(pools, dict):
        raise ValidationError(
            f"{where}: layouts[{row['_index']}].pools: missing (a plan.json from before `invoke rebalance "
            "--to-plan`): run `invoke plan` again"
        )
    counts = {
        pool: _count(pools, pool, f"{where}: layouts[{row['_index']}].pools", fleet) for pool in POOL_NAMES
    }
    return Target(str(doc["recommended"]), counts, tuple(_notes(row, fleet)))


def _same(doc: Mapping[str, Any], where: str, key: str, want: str, option: str) -> None:
    got = doc.get(key)
    if got != want:
        raise ValidationError(
            f"{where}: {key}: the plan was made for {got!r}, not {want!r}: run `{option} {want}` "
            "for this fleet"
        )


def _recommended(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The recommended layout's row (with its index under `_index`)."""
    name = doc.get("recommended")
    if not isinstance(name, str):
        raise ValidationError(f"{where}: recommended: the plan recommends no layout (every layout was cut)")
    rows = doc.get("layouts")
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        if isinstance(row, dict) and row.get("layout") == name:
            return {**row, "_index": i}
    raise ValidationError(f"{where}: layouts: no layout named {name!r}, the one `recommended` names")


def _count(pools: Mapping[str, Any], pool: str, where: str, fleet: Fleet) -> int:
    """Hosts the plan's `pool` needs (0: it has none); refused when its shape is not the profile's."""
    shape = pools.get(pool)
    if shape is None:
        return 0
    try:
        n, tp, budget = (int(shape[k]) for k in ("instances", "tp", "budget"))
    except (KeyError, TypeError, ValueError):
        raise ValidationError(f"{where}.{pool}: needs instances, tp and budget as numbers") from None
    if pool not in fleet.shapes:
        raise ValidationError(
            f"{where}.{pool}: the plan runs {n} {pool} instance(s) and the profile sets no pools.{pool}: "
            "add it to the profile first (see the plan's profile changes)"
        )
    have = fleet.shapes[pool]
    if (tp, budget) != have:
        raise ValidationError(
            f"{where}.{pool}: the plan's {pool} pool runs tp {tp} with budget {budget}, the profile's "
            f"pools.{pool} tp {have[0]} with budget {have[1]}; rebalance moves hosts, it does not reshape "
            "a pool: apply the plan's profile changes first"
        )
    return n


def _notes(row: Mapping[str, Any], fleet: Fleet) -> list[str]:
    """What the plan's layout also asks of the gateway, which moving hosts does not do."""
    notes = []
    threshold = row.get("threshold")
    if isinstance(threshold, int) and threshold != fleet.threshold:
        notes.append(
            f"the plan sends prompts of {threshold}+ tokens to P/D (gateway.long_prompt_tokens is "
            f"{fleet.threshold}): a profile change rebalance does not make"
        )
    stage = STAGE_OF_KIND.get(str(row.get("kind")))
    if stage is not None and stage != fleet.stage:
        notes.append(
            f"the plan's layout runs at stage {stage} (the profile's is {fleet.stage}): walk there with "
            f"`invoke rollout --stage {stage}` once the hosts have moved"
        )
    return notes


def moves_toward(layout: Layout, counts: Mapping[str, int], initial: Layout) -> list[Move]:
    """The moves from `layout` to the plan's host counts, in order (empty: already there); ValidationError
    when the counts cannot be reached by moving hosts (another number of hosts, a pool below its
    minimum, no host that fits)."""
    have = {pool: len(layout.members(pool)) for pool in POOL_NAMES}
    if sum(counts.values()) != sum(have.values()):
        raise ValidationError(
            f"the plan lays out {sum(counts.values())} instance(s), the fleet serves {sum(have.values())} "
            f"({_shown(have)}): a plan for this inventory has one instance per host"
        )
    for pool, n in counts.items():
        if have[pool] and n < layout.minimum(pool):
            raise ValidationError(
                f"the plan leaves the {pool} pool {n} host(s), below its minimum of {layout.minimum(pool)} "
                "(a pool is never emptied by a move)"
            )
    moves: list[Move] = []
    current = layout
    while short := [p for p in POOL_NAMES if counts[p] > len(current.members(p))]:
        move = _next_move(current, short[0], counts, initial, {m.host for m in moves})
        moves.append(move)
        current = current.with_move(move.host, move.target)
    return moves


def _next_move(layout: Layout, to: str, counts: Mapping[str, int], initial: Layout, moved: set[str]) -> Move:
    """The host to move into `to` next (see the module docstring), checked by the mover."""
    over = {p: len(layout.members(p)) - counts[p] for p in POOL_NAMES if len(layout.members(p)) > counts[p]}
    order = list(layout.hosts)
    candidates = [
        h for h, pools in layout.hosts.items() if len(pools) == 1 and pools[0] in over and h not in moved
    ]
    ranked = sorted(
        candidates,
        key=lambda h: (to not in initial.hosts.get(h, ()), -over[layout.hosts[h][0]], -order.index(h)),
    )
    refusals = []
    for host in ranked:
        out = plan_move(layout, host, to)
        if isinstance(out, MovePlan):
            return Move(host, out.source, to, _why(host, out.source, to, initial))
        refusals.append(out.reason)
    raise ValidationError(
        f"no host can move into the {to} pool: " + ("; ".join(refusals) or "no pool has a host to spare")
    )


def _why(host: str, source: str, to: str, initial: Layout) -> str:
    if to in initial.hosts.get(host, ()):
        return f"the inventory puts {host} in the {to} pool"
    return f"the {source} pool has more hosts than the plan's; {host} is its last in inventory order"


def _shown(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{pool} {n}" for pool, n in counts.items() if n) or "no pool"


def counts_of(layout: Layout) -> dict[str, int]:
    """Hosts per pool of a layout."""
    return {pool: len(layout.members(pool)) for pool in POOL_NAMES}


def describe(target: Target, moves: Sequence[Move], before: Layout) -> list[str]:
    """The dry run's lines: the plan's layout, the moves in order and why each host, the notes."""
    lines = [f"to the plan's layout {target.name}: {_shown(target.counts)} (now {_shown(counts_of(before))})"]
    if not moves:
        lines.append("  the fleet already serves it: nothing to move")
    for n, m in enumerate(moves, 1):
        lines.append(f"  {n}. {m.host}: {m.source} -> {m.target} ({m.why})")
    lines.extend(f"note: {note}" for note in target.notes)
    return lines
