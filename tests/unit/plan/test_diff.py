"""The profile and inventory changes that would make a layout so."""

from __future__ import annotations

from pdfleet.plan.diff import Current, inventory_changes, profile_changes
from pdfleet.plan.space import Layout, PoolShape

LAB_CROSS = Current(
    {"prefill": PoolShape(1, 1, 8192), "decode": PoolShape(1, 1, 2048), "colocated": PoolShape(2, 1, 8192)},
    8192,
    "colocated",
)


def test_the_same_layout_changes_only_the_stage() -> None:
    same = Layout(PoolShape(2, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 8192)
    assert profile_changes(LAB_CROSS, same) == [
        "gateway.stage: colocated -> long-prompts (or walk there: invoke rollout --stage long-prompts)"
    ]
    assert inventory_changes(LAB_CROSS, same) == []


def test_colocated_at_tp2_drops_the_p_d_pools_and_resizes_the_group() -> None:
    layout = Layout(colocated=PoolShape(2, 2, 2048))
    assert profile_changes(LAB_CROSS, layout) == [
        "pools.prefill: tensor_parallel_size 1, gpus [0], max_num_batched_tokens 8192 -> (none)",
        "pools.decode: tensor_parallel_size 1, gpus [0], max_num_batched_tokens 2048 -> (none)",
        "pools.colocated: tensor_parallel_size 1, gpus [0], max_num_batched_tokens 8192 -> "
        "tensor_parallel_size 2, gpus [0, 1], max_num_batched_tokens 2048",
    ]
    assert inventory_changes(LAB_CROSS, layout) == [
        "group prefill: 1 host(s) -> 0 host(s)",
        "group decode: 1 host(s) -> 0 host(s)",
    ]


def test_more_prefill_hosts_and_a_new_threshold() -> None:
    layout = Layout(PoolShape(1, 1, 8192), PoolShape(2, 1, 16384), PoolShape(1, 1, 2048), 16384)
    assert "gateway.long_prompt_tokens: 8192 -> 16384" in profile_changes(LAB_CROSS, layout)
    assert inventory_changes(LAB_CROSS, layout) == [
        "group prefill: 1 host(s) -> 2 host(s) with gpus [0]",
        "group colocated: 2 host(s) -> 1 host(s) with gpus [0]",
    ]
