"""What to change in the profile and the inventory to run a recommended layout, as lines an operator reads.

The fleet runs one instance of a pool per host (`fleet.topology`): a pool of n instances at TP t is n
hosts in the pool's inventory group, each with `gpus: [0..t-1]`, and the profile's
`pools.<pool>.tensor_parallel_size: t`, `gpus`, `max_num_batched_tokens`. A layout with P/D and
colocated pools sets `gateway.long_prompt_tokens` to its threshold and the stage that sends long
prompts to P/D; P/D alone sends everything (`all-disagg`); colocated alone stays on `colocated`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.plan.space import Layout, PoolShape

STAGE_OF = {"colocated": "colocated", "hybrid": "long-prompts", "disagg": "all-disagg"}


@dataclass(frozen=True)
class Current:
    """The deployment as it is: each pool's shape (None: absent), the threshold and the stage."""

    pools: dict[str, PoolShape | None]
    threshold: int
    stage: str


def _pool(layout: Layout, name: str) -> PoolShape | None:
    return {"colocated": layout.colocated, "prefill": layout.prefill, "decode": layout.decode}[name]


def _describe(p: PoolShape | None) -> str:
    if p is None:
        return "(none)"
    return f"tensor_parallel_size {p.tp}, gpus {list(range(p.tp))}, max_num_batched_tokens {p.budget}"


def profile_changes(current: Current, layout: Layout) -> list[str]:
    """`key: old -> new` for every profile key the layout changes (empty: nothing to change)."""
    out = []
    for name in ("prefill", "decode", "colocated"):
        old, new = current.pools.get(name), _pool(layout, name)
        old_shape = None if old is None else (old.tp, old.budget)
        new_shape = None if new is None else (new.tp, new.budget)
        if old_shape != new_shape:
            out.append(f"pools.{name}: {_describe(old)} -> {_describe(new)}")
    if layout.threshold is not None and layout.threshold != current.threshold:
        out.append(f"gateway.long_prompt_tokens: {current.threshold} -> {layout.threshold}")
    stage = STAGE_OF[layout.kind]
    if stage != current.stage:
        out.append(
            f"gateway.stage: {current.stage} -> {stage} (or walk there: invoke rollout --stage {stage})"
        )
    return out


def inventory_changes(current: Current, layout: Layout) -> list[str]:
    """Hosts per inventory group (one instance per host) where the count changes."""
    out = []
    for name in ("prefill", "decode", "colocated"):
        old, new = current.pools.get(name), _pool(layout, name)
        have = 0 if old is None else old.instances
        want = 0 if new is None else new.instances
        if have != want:
            gpus = f" with gpus {list(range(new.tp))}" if new is not None else ""
            out.append(f"group {name}: {have} host(s) -> {want} host(s){gpus}")
    return out
