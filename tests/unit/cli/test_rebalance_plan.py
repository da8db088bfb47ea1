"""`invoke rebalance --to-plan FILE`: the dry run checks the plan against the fleet and prints the moves,
why each host, and what the plan asks that moves do not make; a plan for another fleet, a file that is not
a plan, --to-plan beside --host, and a --hold shorter than the gates' window are refused before anything is
read from the fleet, writing nothing. The live moves: tests/lab/test_lab_rebalance.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from invoke.exceptions import Exit

from pdfleet.cli.rebalance import rebalance
from tests.unit.cli.helpers import project_context

SHAPES = {"prefill": (1, 8192), "decode": (1, 2048), "colocated": (1, 8192)}  # lab-cross's pools


def _plan(tmp_path: Path, counts: dict[str, int], **over: Any) -> str:
    """A plan.json for lab-cross on the lab's inventory recommending these host counts."""
    pools = {
        p: {"instances": n, "tp": SHAPES[p][0], "budget": SHAPES[p][1]} if n else None
        for p, n in counts.items()
    }
    row = {"layout": "2P + 1D + 1C long>=8192", "kind": "hybrid", "threshold": 8192, "pools": pools}
    doc = {
        "profile": "lab-cross",
        "model": "llama-3-1-8b",
        "inventory": "inventory/lab.yml",
        "layouts": [row],
        "recommended": row["layout"],
        **over,
    }
    path = tmp_path / "plan" / "plan.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return str(path)


def test_the_dry_run_prints_the_moves_and_why_each_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _plan(tmp_path, {"prefill": 2, "decode": 1, "colocated": 1})
    ctx = project_context(output_dir=str(tmp_path / "out"))
    rebalance(ctx, profile="lab-cross", to_plan=plan, dry_run=True)
    out = capsys.readouterr().out
    assert "layout: the inventory's pool groups" in out
    assert (
        "to the plan's layout 2P + 1D + 1C long>=8192: prefill 2, decode 1, colocated 1 "
        "(now prefill 1, decode 1, colocated 2)\n"
        "  1. lab-colo2: colocated -> prefill (the colocated pool has more hosts than the plan's; lab-colo2 "
        "is its last in inventory order)\n"
        "note: the plan's layout runs at stage long-prompts (the profile's is colocated)"
    ) in out
    assert "(dry run: nothing changes; each move is held to the gates for 20 s)" in out
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("over", "options", "expected"),
    [
        ({"inventory": "inventory/lab-16.yml"}, {}, "inventory: the plan was made for inventory/lab-16.yml"),
        ({"profile": "lab-colocated"}, {}, "profile: the plan was made for 'lab-colocated'"),
        ({}, {"host": "lab-colo2"}, "give --host H --to POOL, or --to-plan FILE, not both"),
        ({}, {"hold": "5"}, "--hold 5: must be at least rollout.window_s (20 s)"),
        ({}, {"hold": "soon"}, "--hold: 'soon' is not a number"),
    ],
)
def test_a_plan_for_another_fleet_or_bad_options_are_refused_writing_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    over: dict[str, Any],
    options: dict[str, str],
    expected: str,
) -> None:
    plan = _plan(tmp_path, {"prefill": 2, "decode": 1, "colocated": 1}, **over)
    ctx = project_context(output_dir=str(tmp_path / "out"))
    with pytest.raises(Exit):
        rebalance(ctx, profile="lab-cross", to_plan=plan, **options)
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("text", "expected"), [("{not json", "not a plan.json"), (None, "no such file")])
def test_a_file_that_is_not_a_plan_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, expected: str
) -> None:
    path = tmp_path / "plan.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(Exit):
        rebalance(project_context(output_dir=str(tmp_path / "out")), profile="lab-cross", to_plan=str(path))
    assert f"--to-plan {path}: {expected}" in capsys.readouterr().err
