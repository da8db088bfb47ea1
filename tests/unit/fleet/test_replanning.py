"""`--to-plan`'s executor through the executor's Fleet protocol: the moves one at a time, each gated; a gate
failing mid-way stops and undoes the finished moves last first, ungated, back to the layout before the first
move; a move failing after its render is undone like a finished one, one failing at its drain has its host
admitted again; a move back that fails says where the fleet is. (The lab moves real hosts:
tests/lab/test_lab_rebalance.py.)"""

from __future__ import annotations

import pytest

from pdfleet.fleet.mover import Layout
from pdfleet.fleet.moving import ADMIT_ROLES, FRONT_ROLES, Front, MoveFailed
from pdfleet.fleet.replan import Move, moves_toward
from pdfleet.fleet.replanning import Held, apply_moves, moved_events
from tests.unit.fleet.helpers import Clock, Recorded

FRONT = Front(gateways=("lab-gw",), monitoring=("lab-gw",))
TARGET = {"prefill": 2, "decode": 2, "colocated": 2}


class Gates:
    """A gate that passes until its `fail_at`-th hold (0: never), recording each hold."""

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at = fail_at
        self.held: list[tuple[str, int, int]] = []

    def __call__(self, move: Move, n: int, total: int) -> Held:
        self.held.append((move.host, n, total))
        if len(self.held) == self.fail_at:
            return Held(False, "failed: ttft-p99-vs-colocated (long): 900 > 2 x colocated 300")
        return Held(True, "every gate passed")


class FailingFleet(Recorded):
    """Recorded, failing its `nth` call of `kind` (render: a converge with all roles; drain: a converge of
    the gateway hosts' policy; unroute)."""

    def __init__(self, kind: str, nth: int) -> None:
        super().__init__()
        self.kind, self.nth, self.seen = kind, nth, 0

    def _count(self, kind: str) -> None:
        if kind == self.kind:
            self.seen += 1
            if self.seen == self.nth:
                raise MoveFailed(f"{kind} number {self.nth} failed")

    def converge(self, layout: Layout, hosts: tuple[str, ...], roles: str | None) -> None:  # type: ignore[override]
        super().converge(layout, hosts, roles)
        if roles is None:
            self._count("render")
        elif roles == FRONT_ROLES:
            self._count("drain")

    def unroute(self, host: str, pool: str) -> None:
        super().unroute(host, pool)
        self._count("unroute")


def _six() -> Layout:
    """Six one-GPU hosts: four colocated (c1-c4), one prefill (p1), one decode (d1)."""
    hosts = {f"c{n}": ("colocated",) for n in range(1, 5)} | {"p1": ("prefill",), "d1": ("decode",)}
    one = (0,)
    return Layout(hosts, dict.fromkeys(hosts, one), dict.fromkeys(("prefill", "decode", "colocated"), one))


def _run(fleet: Recorded, gates: Gates) -> tuple[object, Layout, list[Move]]:
    before = _six()
    moves = moves_toward(before, TARGET, before)
    clock = Clock()
    report = apply_moves(moves, before, FRONT, fleet, gates, 5, clock, clock.sleep)
    return report, before, moves


def test_passing_gates_reach_the_plans_layout_one_gated_move_at_a_time() -> None:
    fleet, gates = Recorded(), Gates()
    report, _, moves = _run(fleet, gates)
    assert [m.host for m in moves] == ["c4", "c3"]
    assert gates.held == [("c4", 1, 2), ("c3", 2, 2)]
    assert report.stopped is None and report.restored == []  # type: ignore[attr-defined]
    assert report.layout.members("colocated") == ["c1", "c2"]  # type: ignore[attr-defined]
    renders = [c[2] for c in fleet.calls if c[0] == "converge" and c[3] is None]
    assert renders == [("c4",), ("c3",)]


def test_a_gate_failing_mid_way_undoes_the_moves_last_first_back_to_the_layout_before() -> None:
    fleet, gates = Recorded(), Gates(fail_at=2)
    report, before, moves = _run(fleet, gates)
    assert report.stopped.startswith("the gates failed after move 2 (c3 -> decode): failed: ttft")  # type: ignore[attr-defined]
    assert report.restored == [moves[1].back(), moves[0].back()]  # type: ignore[attr-defined]
    assert dict(report.layout.hosts) == dict(before.hosts)  # type: ignore[attr-defined]
    assert len(gates.held) == 2  # the moves back are not gated
    renders = [(c[2], dict(c[1])[c[2][0]]) for c in fleet.calls if c[0] == "converge" and c[3] is None]
    assert renders == [
        (("c4",), ("prefill",)),
        (("c3",), ("decode",)),
        (("c3",), ("colocated",)),
        (("c4",), ("colocated",)),
    ]
    assert any(line.startswith("stopping: the gates failed after move 2") for line in fleet.lines)


def test_a_move_failing_after_its_render_is_undone_like_a_finished_one() -> None:
    # the new instance's /metrics never answers (it did not start): its move back does not wait out --wait
    fleet, gates = FailingFleet("render", 2), Gates()
    fleet.busy = [0, 0, 0, 0, *[None] * 100]  # c4's and c3's reads (drain, wait), then unreadable
    report, before, _ = _run(fleet, gates)
    reads = [c for c in fleet.calls if c[0] == "left"]
    # c3's move back: read at the drain, then over a 1 s bound (1 + 3 reads; --wait's 5 s would be 1 + 11)
    assert reads.count(("left", "c3", "decode")) == 4
    assert reads.count(("left", "c4", "prefill")) > 4  # c4 was admitted: its move back waits the bound
    assert report.stopped.startswith("move 2 (c3 -> decode) failed: render: render number 2")  # type: ignore[attr-defined]
    assert [m.host for m in report.restored] == ["c3", "c4"]  # type: ignore[attr-defined]
    assert dict(report.layout.hosts) == dict(before.hosts)  # type: ignore[attr-defined]


def test_a_move_failing_at_its_drain_admits_its_host_again_and_undoes_the_ones_before() -> None:
    fleet, gates = FailingFleet("drain", 2), Gates()
    report, before, _ = _run(fleet, gates)
    assert report.stopped.startswith("move 2 (c3 -> decode) failed: drain: drain number 2")  # type: ignore[attr-defined]
    assert [m.host for m in report.restored] == ["c4"]  # type: ignore[attr-defined]
    assert dict(report.layout.hosts) == dict(before.hosts)  # type: ignore[attr-defined]
    after_first = before.with_move("c4", "prefill")
    drained = ("converge", dict(after_first.drained("c3").hosts), ("lab-gw",), FRONT_ROLES)
    failed_at = fleet.calls.index(drained)
    # a colocated host is admitted again by the policy alone; then c4 goes back (a P/D host: unrouted)
    assert fleet.calls[failed_at + 1 : failed_at + 3] == [
        ("converge", dict(after_first.hosts), ("lab-gw",), ADMIT_ROLES),
        ("unroute", "c4", "prefill"),
    ]


def test_a_move_back_that_fails_says_where_the_fleet_is() -> None:
    fleet, gates = FailingFleet("render", 3), Gates(fail_at=2)
    with pytest.raises(MoveFailed) as err:
        _run(fleet, gates)
    message = str(err.value)
    assert message.startswith("the gates failed after move 2")
    assert "going back, moving c3 to colocated failed too (render: render number 3" in message
    assert "`invoke rebalance --host c3 --to colocated` or `invoke provision` finishes it" in message


def test_a_pd_host_failing_at_its_drain_is_readmitted_through_a_router_restart() -> None:
    before = _six().with_move("c4", "prefill").with_move("c3", "prefill")
    moves = moves_toward(before, {"prefill": 2, "decode": 2, "colocated": 2}, before)
    assert [(m.host, m.source, m.target) for m in moves] == [("p1", "prefill", "decode")]
    fleet, clock = FailingFleet("unroute", 1), Clock()
    report = apply_moves(moves, before, FRONT, fleet, Gates(), 5, clock, clock.sleep)
    assert report.restored == [] and dict(report.layout.hosts) == dict(before.hosts)  # type: ignore[union-attr]
    # vllm-router adds no P/D worker over HTTP: its argv goes without the host and back, so it restarts
    assert fleet.calls[1:] == [
        ("converge", dict(before.drained("p1").hosts), ("lab-gw",), ADMIT_ROLES),
        ("converge", dict(before.hosts), ("lab-gw",), ADMIT_ROLES),
    ]


def test_each_move_made_is_one_audit_line_with_its_gate_hold_and_why_this_host() -> None:
    report, _, moves = _run(Recorded(), Gates(fail_at=2))
    events = moved_events(report, "by hand (--to-plan p.json)", proposal="12.000")  # type: ignore[arg-type]
    assert [(e["event"], e["proposal"], e["host"], e["from"], e["to"]) for e in events] == [
        ("moved", "12.000", "c4", "colocated", "prefill"),
        ("moved", "12.000", "c3", "colocated", "decode"),
    ]
    assert events[0]["reason"] == f"by hand (--to-plan p.json); {moves[0].why}"
    assert events[0]["gates"] == "every gate passed" and events[1]["gates"].startswith("failed: ttft")
    assert set(events[0]) >= {"at_drain", "outlived", "kv_held", "seconds"}
    assert moved_events(_run(Recorded(), Gates())[0], "r")[1]["gates"] == "every gate passed"  # type: ignore[arg-type]
