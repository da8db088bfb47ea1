"""The rebalance executor: what each step asks of the fleet, in order (a colocated host leaves through the
gateway's policy, a P/D host through the router's /remove_worker), the bounded wait and the requests that
outlive it, and a failing step that stops the move naming itself. The fleet here records what it is asked
(the lab test moves real hosts: tests/lab/test_lab_rebalance.py)."""

from __future__ import annotations

import pytest

from pdfleet.fleet.mover import Layout, Left, MovePlan, layout_of, plan_move
from pdfleet.fleet.moving import ADMIT_ROLES, FRONT_ROLES, Front, MoveFailed, execute
from tests.unit.fleet.helpers import Clock, Recorded
from tests.unit.roles.helpers import deployment

FRONT = Front(gateways=("lab-gw",), monitoring=("lab-gw",))


def _layout() -> Layout:
    fleet = deployment("lab-cross")
    return layout_of(fleet.profile.served[0], fleet.inventory)


def _plan(layout: Layout, host: str, to: str, wait_s: float = 30) -> MovePlan:
    plan = plan_move(layout, host, to, wait_s)
    assert isinstance(plan, MovePlan), plan
    return plan


def _kinds(fleet: Recorded) -> list[object]:
    return [c[0] for c in fleet.calls]


def test_a_colocated_host_leaves_through_the_gateway_then_renders_checks_and_is_admitted() -> None:
    before = _layout()
    plan = _plan(before, "lab-colo2", "decode")
    fleet, clock = Recorded(busy=[2, 1]), Clock()
    report = execute(plan, before, FRONT, fleet, clock, clock.sleep)
    drained = dict(before.drained("lab-colo2").hosts)
    after = dict(plan.after.hosts)
    assert fleet.calls == [
        ("converge", drained, ("lab-gw",), FRONT_ROLES),
        ("left", "lab-colo2", "colocated"),
        ("left", "lab-colo2", "colocated"),
        ("left", "lab-colo2", "colocated"),
        ("keep", after),
        ("converge", after, ("lab-colo2",), None),
        ("healthy", "lab-colo2", "decode"),
        ("converge", after, ("lab-gw",), ADMIT_ROLES),
    ]
    assert (report.at_drain, report.outlived) == (2, 0)
    assert list(report.seconds) == ["drain", "wait", "render", "health", "admit"]
    assert "      2 request(s) in lab-colo2 at the drain" in fleet.lines
    assert fleet.lines[0].startswith("[1/5] drain: stop routing new requests to lab-colo2")


def test_a_decode_host_leaves_through_the_routers_remove_worker_without_touching_the_gateway() -> None:
    before = _layout().with_move("lab-colo2", "decode")
    plan = _plan(before, "lab-colo2", "colocated")
    fleet, clock = Recorded(), Clock()
    execute(plan, before, FRONT, fleet, clock, clock.sleep)
    assert fleet.calls[:2] == [("unroute", "lab-colo2", "decode"), ("left", "lab-colo2", "decode")]
    assert [c for c in fleet.calls if c[0] == "converge"][0][3] is None  # the first converge: the host's


def test_requests_outliving_the_bound_are_reported_and_the_move_goes_on() -> None:
    before = _layout()
    fleet, clock = Recorded(busy=[3] * 1000), Clock()
    report = execute(_plan(before, "lab-colo2", "decode", wait_s=5), before, FRONT, fleet, clock, clock.sleep)
    assert report.outlived == 3
    assert any("3 request(s) still in lab-colo2 after 5 s" in line for line in fleet.lines)
    assert _kinds(fleet)[-1] == "converge"  # admitted all the same
    assert 5.0 <= report.seconds["wait"] <= 7.0


def test_an_unreadable_instance_is_waited_for_to_the_bound_and_said() -> None:
    before = _layout()
    fleet, clock = Recorded(busy=[None] * 1000), Clock()
    report = execute(_plan(before, "lab-colo2", "decode", wait_s=4), before, FRONT, fleet, clock, clock.sleep)
    assert report.outlived is None
    assert any("/metrics could not be read" in line for line in fleet.lines)


@pytest.mark.parametrize(("fail", "step", "calls"), [("all", "render", 5), (ADMIT_ROLES, "admit", 7)])
def test_a_failing_step_stops_the_move_naming_it(fail: str, step: str, calls: int) -> None:
    before = _layout()
    fleet, clock = Recorded(busy=[1], fail=fail), Clock()
    with pytest.raises(MoveFailed, match=f"^{step}: provisioning .* failed: boom"):
        execute(_plan(before, "lab-colo2", "decode"), before, FRONT, fleet, clock, clock.sleep)
    assert len(fleet.calls) == calls


def test_an_instance_that_never_answers_health_fails_the_move_before_admitting_it() -> None:
    before = _layout()
    fleet, clock = Recorded(healthy_after=10_000), Clock()
    with pytest.raises(MoveFailed, match="^health: lab-colo2's decode instance did not answer /health"):
        execute(_plan(before, "lab-colo2", "decode"), before, FRONT, fleet, clock, clock.sleep)
    assert (
        "converge",
        dict(_plan(before, "lab-colo2", "decode").after.hosts),
        ("lab-gw",),
        ADMIT_ROLES,
    ) not in (fleet.calls)


def test_a_prefill_host_is_waited_for_until_no_decode_still_reads_its_kv() -> None:
    before = _layout().with_move("lab-colo2", "prefill")
    plan = _plan(before, "lab-colo2", "colocated", wait_s=30)
    held = Left(0, kv_held=True)
    fleet, clock = Recorded(busy=[Left(1, True), held, held, held]), Clock()
    report = execute(plan, before, FRONT, fleet, clock, clock.sleep)
    assert [c for c in fleet.calls if c[0] == "left"] == [("left", "lab-colo2", "prefill")] * 5
    assert (report.at_drain, report.outlived, report.kv_held) == (1, 0, False)
    # held to the bound: reported, and the move goes on
    fleet, clock = Recorded(busy=[held] * 1000), Clock()
    report = execute(plan, before, FRONT, fleet, clock, clock.sleep)
    assert (report.outlived, report.kv_held) == (0, True)
    assert any("still holds KV for a decode's read after 30 s" in line for line in fleet.lines)
