"""The pure mover: a move's steps in order (drain before anything, admit last) and the layout after it,
and one test per refusal (unknown pool, unknown host, a same-host P/D host, no-op, a pool the profile does
not set, a host whose GPUs do not fit the role, the last host of a pool, a pool's minimum)."""

from __future__ import annotations

from pdfleet.fleet.mover import (
    Layout,
    Left,
    MovePlan,
    Refusal,
    drains_through_router,
    in_flight,
    keeps_live_layout,
    layout_of,
    left_in,
    plan_move,
)
from pdfleet.model.rebalancing import RebalanceSpec
from tests.unit.roles.helpers import deployment


def _lab_cross() -> Layout:
    fleet = deployment("lab-cross")
    return layout_of(fleet.profile.served[0], fleet.inventory)


def _refused(layout: Layout, host: str, to: str) -> str:
    out = plan_move(layout, host, to)
    assert isinstance(out, Refusal), out
    return out.reason


def test_the_layout_is_the_profile_and_the_inventory() -> None:
    layout = _lab_cross()
    assert dict(layout.hosts) == {
        "lab-colo1": ("colocated",),
        "lab-colo2": ("colocated",),
        "lab-p1": ("prefill",),
        "lab-d1": ("decode",),
    }
    assert layout.pool_gpus == {"prefill": (0,), "decode": (0,), "colocated": (0,)}


def test_a_move_drains_waits_renders_checks_health_and_admits_in_that_order() -> None:
    out = plan_move(_lab_cross(), "lab-colo2", "decode", wait_s=30)
    assert isinstance(out, MovePlan)
    assert [s.kind for s in out.steps] == ["drain", "wait", "render", "health", "admit"]
    assert [s.pool for s in out.steps] == ["colocated", "colocated", "decode", "decode", "decode"]
    assert out.steps[1].bound_s == 30
    assert (out.source, out.target) == ("colocated", "decode")
    assert out.after.members("decode") == ["lab-colo2", "lab-d1"]
    assert out.after.members("colocated") == ["lab-colo1"]
    # and back: the move is its own inverse
    back = plan_move(out.after, "lab-colo2", "colocated")
    assert isinstance(back, MovePlan) and back.after == _lab_cross()


def test_an_unknown_pool_is_refused() -> None:
    assert "unknown pool 'gpu'" in _refused(_lab_cross(), "lab-colo2", "gpu")


def test_an_unknown_host_is_refused_naming_the_hosts_that_serve() -> None:
    why = _refused(_lab_cross(), "lab-gw", "decode")
    assert "'lab-gw' serves no pool" in why and "lab-colo1, lab-colo2, lab-p1, lab-d1" in why


def test_a_same_host_pd_host_is_refused() -> None:
    fleet = deployment("lab-same-host", "inventory/lab-same-host.yml")
    layout = layout_of(fleet.profile.served[0], fleet.inventory)
    (host,) = layout.members("prefill")
    assert "serves prefill and decode at once" in _refused(layout, host, "decode")


def test_a_move_to_the_hosts_own_pool_is_refused() -> None:
    assert "already serves the colocated pool" in _refused(_lab_cross(), "lab-colo1", "colocated")


def test_a_pool_the_profile_does_not_set_is_refused() -> None:
    fleet = deployment("lab-colocated")
    layout = layout_of(fleet.profile.served[0], fleet.inventory)
    assert "sets no decode pool" in _refused(layout, "lab-colo2", "decode")


def test_a_host_without_the_roles_gpus_is_refused() -> None:
    layout = Layout(
        {"a": ("colocated",), "b": ("colocated",), "d": ("decode",)},
        {"a": (0,), "b": (0,), "d": (0, 1)},
        {"colocated": (0,), "decode": (0, 1)},
    )
    why = _refused(layout, "b", "decode")
    assert "host b has no GPU 1 that pools.decode.gpus [0, 1] needs (it declares gpus [0])" in why


def test_the_last_host_of_a_pool_is_refused() -> None:
    why = _refused(_lab_cross(), "lab-d1", "prefill")
    assert "lab-d1 is the last host of the decode pool" in why


def test_a_pool_is_not_left_below_its_minimum() -> None:
    layout = _lab_cross()
    layout = Layout(layout.hosts, layout.host_gpus, layout.pool_gpus, {"colocated": 2})
    assert "colocated pool would keep 1 host(s), below its minimum of 2" in _refused(
        layout, "lab-colo2", "decode"
    )


def test_a_drained_host_serves_no_pool_and_the_others_keep_theirs() -> None:
    drained = _lab_cross().drained("lab-colo2")
    assert drained.hosts["lab-colo2"] == ()
    assert drained.members("colocated") == ["lab-colo1"] and drained.members("decode") == ["lab-d1"]


def test_p_d_hosts_drain_through_the_router_and_colocated_ones_through_the_gateway() -> None:
    assert drains_through_router("prefill") and drains_through_router("decode")
    assert not drains_through_router("colocated")


def test_in_flight_is_running_plus_waiting_and_none_without_either_series() -> None:
    assert in_flight({"vllm:num_requests_running": 2.0, "vllm:num_requests_waiting": 1.0, "x": 9.0}) == 3
    assert in_flight({"vllm:num_requests_running": 0.0}) == 0
    assert in_flight({"process_cpu_seconds_total": 1.0}) is None


def test_the_live_layout_is_kept_unless_the_move_goes_back_to_the_inventorys() -> None:
    initial = _lab_cross()
    moved = initial.with_move("lab-colo2", "decode")
    assert keeps_live_layout(moved, initial)
    assert not keeps_live_layout(moved.with_move("lab-colo2", "colocated"), initial)


def test_a_prefill_instance_is_drained_only_once_no_decode_can_still_read_its_kv() -> None:
    idle = {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}
    assert left_in("prefill", {**idle, "vllm:kv_cache_usage_perc": 0.02}) == Left(0, kv_held=True)
    assert not Left(0, kv_held=True).done
    assert left_in("prefill", {**idle, "vllm:kv_cache_usage_perc": 0.0}) == Left(0)
    assert Left(0).done and not Left(1).done
    assert left_in("prefill", idle) == Left(0, kv_held=True)  # no KV usage exported: cannot tell
    # a decode or colocated instance's KV is its own requests' (a prefix cache's free blocks count as free)
    assert left_in("decode", {**idle, "vllm:kv_cache_usage_perc": 0.3}) == Left(0)
    assert left_in("prefill", {"x": 1.0}) is None


def test_the_profiles_minimums_hold_every_move() -> None:
    """rollout.rebalance.minimums (issue 35): a move that leaves a pool below its minimum is refused."""
    fleet = deployment("lab-cross")
    spec = fleet.profile.served[0]
    rollout = spec.rollout.model_copy(update={"rebalance": RebalanceSpec(minimums={"colocated": 2})})
    layout = layout_of(spec.model_copy(update={"rollout": rollout}), fleet.inventory)
    assert layout.minimum("colocated") == 2 and layout.minimum("decode") == 1
    out = plan_move(layout, "lab-colo2", "decode")
    assert (
        isinstance(out, Refusal)
        and out.reason == "the colocated pool would keep 1 host(s), below its minimum of 2"
    )
