"""`--to-plan`, pure: a plan.json's recommended layout read as host counts per pool and refused when it was
made for another profile, model or inventory or reshapes a pool; the moves toward its counts one host at a
time, each host chosen deterministically with its reason, refused when the counts cannot be reached."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from pdfleet.errors import ValidationError
from pdfleet.fleet.mover import Layout, layout_of
from pdfleet.fleet.replan import Fleet, Move, counts_of, describe, moves_toward, target_of
from tests.unit.roles.helpers import deployment

SHAPES = {"prefill": (1, 8192), "decode": (1, 2048), "colocated": (1, 8192)}  # lab-cross's pools
FLEET = Fleet("lab-cross", "llama-3-1-8b", "inventory/lab.yml", SHAPES, 8192, "colocated")


def _layout() -> Layout:
    fleet = deployment("lab-cross")
    return layout_of(fleet.profile.served[0], fleet.inventory)


def _doc(counts: dict[str, int], **over: Any) -> dict[str, Any]:
    """A plan.json as `invoke plan` writes it, recommending a layout with these host counts."""
    pools = {
        pool: {"instances": n, "tp": SHAPES[pool][0], "budget": SHAPES[pool][1]} if n else None
        for pool, n in counts.items()
    }
    rec = " + ".join(f"{n}{pool[0].upper()}" for pool, n in counts.items() if n)
    other = {"layout": "4C tp1 b8192", "kind": "colocated", "threshold": None, "pools": {}}
    row = {"layout": rec, "kind": "hybrid", "threshold": 8192, "pools": pools}
    doc = {
        "profile": "lab-cross",
        "model": "llama-3-1-8b",
        "inventory": "inventory/lab.yml",
        "layouts": [other, row],
        "recommended": rec,
    }
    return {**doc, **over}


def test_a_plan_reads_as_host_counts_with_what_moves_do_not_change() -> None:
    target = target_of(_doc({"prefill": 2, "decode": 1, "colocated": 1}), "p.json", FLEET)
    assert dict(target.counts) == {"prefill": 2, "decode": 1, "colocated": 1}
    assert target.name == "2P + 1D + 1C"
    assert target.notes == (
        "the plan's layout runs at stage long-prompts (the profile's is colocated): walk there with "
        "`invoke rollout --stage long-prompts` once the hosts have moved",
    )


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        (
            {"profile": "lab-colocated"},
            "profile: the plan was made for 'lab-colocated', not 'lab-cross'",
        ),
        ({"model": "other"}, "model: the plan was made for 'other'"),
        ({"inventory": "inventory/lab-16.yml"}, "inventory: the plan was made for inventory/lab-16.yml, not"),
        ({"inventory": None}, "inventory: the plan does not say which inventory it was made for"),
        ({"recommended": None}, "recommended: the plan recommends no layout"),
        ({"recommended": "9C"}, "layouts: no layout named '9C'"),
    ],
)
def test_a_plan_for_another_fleet_is_refused_naming_the_key(over: dict[str, Any], expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        target_of(_doc({"prefill": 1, "decode": 1, "colocated": 2}, **over), "p.json", FLEET)
    assert str(err.value).startswith("p.json: " + expected)


def test_a_plan_that_reshapes_a_pool_is_refused() -> None:
    doc = _doc({"prefill": 1, "decode": 1, "colocated": 2})
    doc["layouts"][1]["pools"]["prefill"]["tp"] = 2
    with pytest.raises(ValidationError) as err:
        target_of(doc, "p.json", FLEET)
    assert str(err.value).startswith(
        "p.json: layouts[1].pools.prefill: the plan's prefill pool runs tp 2 with budget 8192, the "
        "profile's pools.prefill tp 1 with budget 8192; rebalance moves hosts"
    )
    no_pool = replace(FLEET, shapes={"colocated": (1, 8192)})
    with pytest.raises(ValidationError, match="the profile sets no pools.prefill"):
        target_of(_doc({"prefill": 1, "decode": 1, "colocated": 2}), "p.json", no_pool)


def test_the_moves_take_the_last_spare_host_and_a_host_back_where_the_inventory_had_it() -> None:
    layout = _layout()
    moves = moves_toward(layout, {"prefill": 2, "decode": 1, "colocated": 1}, layout)
    assert moves == [
        Move(
            "lab-colo2",
            "colocated",
            "prefill",
            "the colocated pool has more hosts than the plan's; lab-colo2 is its last in inventory order",
        )
    ]
    moved = layout.with_move("lab-colo2", "decode").with_move("lab-colo1", "prefill")
    back = moves_toward(moved, {"prefill": 1, "decode": 1, "colocated": 2}, layout)
    assert [(m.host, m.target, m.why) for m in back] == [
        ("lab-colo2", "colocated", "the inventory puts lab-colo2 in the colocated pool"),
        ("lab-colo1", "colocated", "the inventory puts lab-colo1 in the colocated pool"),
    ]
    assert moves_toward(layout, counts_of(layout), layout) == []


def test_each_move_keeps_every_pool_at_its_minimum_and_the_counts_must_be_this_fleets() -> None:
    layout = _layout()
    with pytest.raises(ValidationError, match="leaves the colocated pool 0 host"):
        moves_toward(layout, {"prefill": 2, "decode": 2, "colocated": 0}, layout)
    with pytest.raises(ValidationError, match="the plan lays out 5 instance"):
        moves_toward(layout, {"prefill": 2, "decode": 1, "colocated": 2}, layout)
    kept = Layout(layout.hosts, layout.host_gpus, layout.pool_gpus, {"colocated": 2})
    with pytest.raises(ValidationError, match="below its minimum of 2"):
        moves_toward(kept, {"prefill": 2, "decode": 1, "colocated": 1}, layout)


def test_a_pool_no_spare_host_fits_is_refused_with_the_movers_reasons() -> None:
    layout = _layout()
    needs_two = Layout(layout.hosts, layout.host_gpus, {**layout.pool_gpus, "prefill": (0, 1, 2)})
    with pytest.raises(ValidationError) as err:
        moves_toward(needs_two, {"prefill": 2, "decode": 1, "colocated": 1}, layout)
    assert "no host can move into the prefill pool: host lab-colo2 has no GPU 2 " in str(err.value)


def test_the_dry_run_lines_say_the_layout_each_move_and_the_notes() -> None:
    layout = _layout()
    target = target_of(_doc({"prefill": 2, "decode": 1, "colocated": 1}), "p.json", FLEET)
    lines = describe(target, moves_toward(layout, target.counts, layout), layout)
    assert lines[0] == (
        "to the plan's layout 2P + 1D + 1C: prefill 2, decode 1, colocated 1 "
        "(now prefill 1, decode 1, colocated 2)"
    )
    assert lines[1].startswith("  1. lab-colo2: colocated -> prefill (the colocated pool has more")
    assert lines[2].startswith("note: the plan's layout runs at stage long-prompts")
