"""The automatic rebalance's moves from the control machine, pure: only the newest `mode: on` proposal is
carried out, at most once (a taken one never again), an interrupted one resolved toward where the live layout
puts its host, a stale one or one no host can carry skipped with why; --follow's pause after failed looks;
and the resolve executor through the executor's Fleet protocol."""

from __future__ import annotations

from typing import Any

import pytest

from pdfleet.fleet.mover import Layout
from pdfleet.fleet.moving import ADMIT_ROLES, Front
from pdfleet.fleet.proposed import (
    Action,
    Proposal,
    audit_events,
    next_action,
    proposals_in,
    retry_pause,
    taken_event,
    where_now,
)
from pdfleet.fleet.replan import Move
from pdfleet.fleet.replanning import resolve
from tests.unit.fleet.helpers import Recorded

FRONT = Front(gateways=("lab-gw",), monitoring=("lab-gw",))
NOW = 1_000_000.0


def _four() -> tuple[Layout, Layout]:
    """lab-cross after lab-colo2 moved to decode: c1 colocated, p1 prefill, d1 + c2 decode."""
    hosts = {"c1": ("colocated",), "c2": ("decode",), "p1": ("prefill",), "d1": ("decode",)}
    initial = {**hosts, "c2": ("colocated",)}
    one = (0,)
    pools = dict.fromkeys(("prefill", "decode", "colocated"), one)
    return Layout(hosts, dict.fromkeys(hosts, one), pools), Layout(initial, dict.fromkeys(hosts, one), pools)


def _event(at: float, source: str = "decode", target: str = "prefill", mode: str = "on") -> dict[str, Any]:
    return {"at": at, "event": "rebalance-proposal", "mode": mode, "from": source, "to": target, "why": "q"}


def _next(history: list[dict[str, Any]], audit: list[dict[str, Any]], now: float = NOW) -> Action:
    layout, initial = _four()
    return next_action(proposals_in(history), audit, layout, initial, now, 120.0)


def test_the_newest_proposal_is_carried_with_the_mover_s_host_choice() -> None:
    action = _next([_event(NOW - 300), _event(NOW - 10)], [])
    assert action.kind == "carry" and action.key == f"{NOW - 10:.3f}"
    # of the decode pool's two, the last in inventory order (d1: no inventory pool says prefill for either)
    assert action.move == Move(
        "d1",
        "decode",
        "prefill",
        "the decode pool has more hosts than the plan's; d1 is its last in inventory order",
    )
    assert taken_event(action) == {
        "event": "proposal-taken",
        "proposal": action.key,
        "host": "d1",
        "from": "decode",
        "to": "prefill",
        "why": action.move.why,  # type: ignore[union-attr]
        "proposed": "q",
    }


def test_a_proposal_toward_the_colocated_pool_moves_the_host_the_inventory_puts_there() -> None:
    action = _next([_event(NOW - 1, source="decode", target="colocated")], [])
    assert action.kind == "carry"
    assert action.move == Move("c2", "decode", "colocated", "the inventory puts c2 in the colocated pool")


def test_dry_run_proposals_and_foreign_lines_are_never_acted_on() -> None:
    history = [_event(NOW - 5, mode="dry-run"), {"event": "rebalance-proposal", "mode": "on"}, {"event": "x"}]
    assert proposals_in(history) == []
    assert _next(history, []).kind == "none"


def test_a_taken_and_finished_proposal_is_never_carried_again_nor_an_older_one() -> None:
    key = f"{NOW - 10:.3f}"
    audit = [{"event": "proposal-taken", "proposal": key, "host": "d1", "from": "decode", "to": "prefill"}]
    done = [*audit, {"event": "moved", "proposal": key, "host": "d1"}]
    action = _next([_event(NOW - 30), _event(NOW - 10)], done)
    assert (action.kind, action.key) == ("none", key)
    assert "handled already" in action.why


def test_a_taken_proposal_without_its_end_is_resolved_not_carried_again() -> None:
    key = f"{NOW - 10:.3f}"
    taken = {"event": "proposal-taken", "proposal": key, "host": "d1", "from": "decode", "to": "prefill"}
    action = _next([_event(NOW - 10), _event(NOW - 2)], [taken])  # even with a newer proposal waiting
    assert (action.kind, action.key) == ("resolve", key)
    assert action.move == Move("d1", "decode", "prefill", "")


@pytest.mark.parametrize(
    ("audit", "expected"),
    [
        ([], "proposed 121 s ago, more than rollout.rebalance.act_within_s (120 s)"),
        ([{"event": "proposal-skipped", "proposal": f"{NOW - 121:.3f}"}], "handled already"),
    ],
)
def test_a_stale_proposal_is_skipped_once(audit: list[dict[str, Any]], expected: str) -> None:
    action = _next([_event(NOW - 121)], audit)
    assert action.kind == ("skip" if not audit else "none")
    assert expected in action.why


def test_a_proposal_the_giving_pool_s_minimum_forbids_is_skipped_with_why() -> None:
    action = _next([_event(NOW - 1, source="prefill", target="decode")], [])
    assert action.kind == "skip"
    assert "below its minimum of 1" in action.why


def test_audit_lines_from_every_gateway_host_torn_lines_skipped() -> None:
    texts = ['{"event": "moved"}\n{"event": "proposal-ta', '[1]\n{"event": "reset"}\n']
    assert audit_events(texts) == [{"event": "moved"}, {"event": "reset"}]


def test_resolving_a_move_interrupted_at_its_drain_admits_its_host_again() -> None:
    layout, _ = _four()
    move = Move("d1", "decode", "prefill", "")
    assert where_now(layout, move) == "source"
    fleet = Recorded()
    resolve(move, layout, "source", FRONT, fleet)
    # a P/D host: its router's argv goes without it and back, so the router restarts with it
    assert fleet.calls == [
        ("converge", dict(layout.drained("d1").hosts), ("lab-gw",), ADMIT_ROLES),
        ("converge", dict(layout.hosts), ("lab-gw",), ADMIT_ROLES),
    ]


def test_resolving_a_move_interrupted_after_its_render_finishes_it() -> None:
    layout, _ = _four()
    after = layout.with_move("d1", "prefill")
    move = Move("d1", "decode", "prefill", "")
    assert where_now(after, move) == "target"
    fleet = Recorded()
    resolve(move, after, "target", FRONT, fleet)
    assert fleet.calls == [
        ("converge", dict(after.hosts), ("d1",), None),
        ("converge", dict(after.hosts), ("lab-gw",), ADMIT_ROLES),
    ]


def test_a_proposal_is_keyed_by_its_time() -> None:
    assert Proposal(12.34567, "decode", "prefill", "q").key == "12.346"


@pytest.mark.parametrize(
    ("failures", "every_s", "pause"),
    [(1, 5.0, 10.0), (2, 5.0, 20.0), (4, 5.0, 80.0), (3, 30.0, 120.0), (1, 3600.0, 3600.0), (5, 5.0, None)],
)
def test_follow_waits_longer_after_each_failed_look_and_stops_after_five(
    failures: int, every_s: float, pause: float | None
) -> None:
    assert retry_pause(failures, every_s) == pause
