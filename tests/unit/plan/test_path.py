"""The request path: read from a burst's client TTFTs and the instances' /metrics snapshots around it, given
by the profile, or not modelled; and what it does to a prediction (first tokens later, gaps unchanged)."""

from __future__ import annotations

import math

import pytest

from pdfleet.bench.stats import Bounds
from pdfleet.model import catalog
from pdfleet.plan.gaps import TTFT, deltas
from pdfleet.plan.path import NOT_MODELLED, RequestPath, measured, of_doc, of_profile, route_figures
from pdfleet.plan.predict import Request, simulate
from pdfleet.plan.report import path_text
from pdfleet.plan.space import Hardware, Layout, PoolShape

AT = "2026-12-03 22:00:00 UTC"


def _s(name: str, pool: str, role: str, host: str, value: float) -> dict[str, object]:
    return {"name": name, "labels": {"pool": pool, "role": role, "host": host}, "value": value}


def _snap(
    n: int, colo_s: float = 0.016, pre_s: float = 0.020, dec_s: float = 0.008
) -> list[dict[str, object]]:
    """The instances' TTFT histograms (sum, count) after n first tokens each: two colocated hosts sharing
    them, one prefill and one decode (the /metrics samples `plan_validate.snapshot` keeps)."""
    return [
        _s(f"{TTFT}_count", "colocated", "colocated", "lab-colo1", n // 2),
        _s(f"{TTFT}_sum", "colocated", "colocated", "lab-colo1", colo_s * (n // 2)),
        _s(f"{TTFT}_count", "colocated", "colocated", "lab-colo2", n - n // 2),
        _s(f"{TTFT}_sum", "colocated", "colocated", "lab-colo2", colo_s * (n - n // 2)),
        _s(f"{TTFT}_count", "disagg", "prefill", "lab-p1", n),
        _s(f"{TTFT}_sum", "disagg", "prefill", "lab-p1", pre_s * n),
        _s(f"{TTFT}_count", "disagg", "decode", "lab-d1", n),
        _s(f"{TTFT}_sum", "disagg", "decode", "lab-d1", dec_s * n),
    ]


def test_the_path_is_the_clients_mean_ttft_minus_the_instances_own_over_the_burst() -> None:
    lab = deltas(_snap(3), _snap(23))  # warm-ups before the first snapshot: 20 first tokens in the window
    colo = route_figures("colocated", [0.0236] * 10 + [0.0256] * 10, lab)
    pd = route_figures("disagg", [0.040] * 20, lab)
    assert colo.own_ms == pytest.approx({"colocated": 16.0}) and colo.counted == {"colocated": 20}
    assert pd.own_ms == pytest.approx({"prefill": 20.0, "decode": 8.0})
    path, lines = measured([colo, pd], AT, "lab-cross's gateway")
    # each request's client TTFT minus the instances' own mean: 23.6 - 16 and 25.6 - 16; 40 - (20 + 8)
    assert path.colocated_ms == pytest.approx((7.6,) * 10 + (9.6,) * 10)
    assert path.disagg_ms == pytest.approx((12.0,) * 20)
    means = (path.mean_ms("colocated"), path.p95_ms("colocated"), path.mean_ms("disagg"))
    assert means == pytest.approx((8.6, 9.6, 12.0))
    assert path.modelled and path.at == AT and path.source == "measured on lab-cross's gateway"
    assert lines[0] == (
        "request path colocated: client mean TTFT 24.6 ms, instances' own colocated 16.0 ms: path mean "
        "8.6 ms, P95 9.6 ms (20 minimal requests)"
    )
    assert lines[1].endswith(
        "instances' own prefill 20.0 + decode 8.0 ms: path mean 12.0 ms, P95 12.0 ms (20 minimal requests)"
    )
    # dealt to a route's requests in arrival order, cycling: the 11th gets the 11th sample, the 21st the 1st
    assert [path.seconds("colocated", i) for i in (0, 10, 20)] == pytest.approx([0.0076, 0.0096, 0.0076])
    assert path.seconds("disagg", 3) == pytest.approx(0.012)
    assert of_doc(path.doc()) == path and path.doc()["colocated_mean_ms"] == pytest.approx(8.6)  # plan.json


def test_a_route_whose_instances_counted_other_requests_is_not_measured_and_says_so() -> None:
    lab = deltas(_snap(3), _snap(26))  # 23 first tokens counted for a burst of 20: other traffic
    colo = route_figures("colocated", [0.025] * 20, deltas(_snap(3), _snap(23)))
    pd = route_figures("disagg", [0.040] * 20, lab)
    path, lines = measured([colo, pd], AT, "g")
    assert path.disagg_ms == () and path.mean_ms("disagg") == 0
    assert path.mean_ms("colocated") == pytest.approx(9.0)
    assert "not measured, 0 ms: the instances counted other first tokens than the burst's 20" in lines[1]
    assert path.source == "measured on g (disagg: not measured, 0)"


def test_no_route_measured_a_negative_path_or_no_success_leave_the_path_unmodelled() -> None:
    lab = deltas(_snap(3), _snap(23))
    fast = route_figures("colocated", [0.010] * 20, lab)  # under the instances' own 16 ms: not a path
    none = route_figures("disagg", [], lab)
    path, lines = measured([fast, none], AT, "g")
    assert not path.modelled and path.colocated_ms == path.disagg_ms == ()
    assert path.seconds("disagg", 5) == 0
    assert "is under the instances' own: not a path" in lines[0]
    assert lines[1].endswith("not measured, 0 ms: no request of the burst succeeded")
    assert path.text() == "request path: not modelled (0 ms): measured on g, no route gave a figure"
    assert math.isnan(route_figures("colocated", [0.02], {}).own_ms["colocated"])


def test_the_profile_gives_it_with_its_source_and_neither_says_it_is_not_modelled() -> None:
    given = of_profile(7.5, 9.0, "plan --measure-path on lab-cross, 2026-12-03", "lab-cross")
    assert given.text() == (
        "request path: colocated mean 7.5 ms, P/D mean 9.0 ms, added to each first token (profile "
        "lab-cross's plan.request_path: plan --measure-path on lab-cross, 2026-12-03)"
    )
    assert NOT_MODELLED.seconds("colocated") == NOT_MODELLED.seconds("disagg") == 0
    assert "not modelled (0 ms)" in NOT_MODELLED.text() and "plan.request_path" in NOT_MODELLED.text()
    assert path_text(given.doc()) == given.text() and path_text(None) == NOT_MODELLED.text()  # plan.json


def test_the_prediction_adds_each_routes_path_to_its_first_tokens_and_leaves_the_gaps() -> None:
    hw = Hardware(catalog.GPUS["H100-SXM"], catalog.MODELS["Llama-3.1-8B"], catalog.LINKS["roce-400g"])
    reqs = sorted(
        [Request(i * 0.5, 500, 32, 500) for i in range(20)] + [Request(2.25, 20000, 32, 20000)],
        key=lambda r: r.at,
    )
    layout = Layout(PoolShape(1, 1, 8192), PoolShape(1, 1, 8192), PoolShape(1, 1, 2048), 8192)
    bare = simulate(layout, reqs, hw, Bounds(3000, 60, 250), 8192)
    path = RequestPath((8.0,), (30.0,), "test", AT, True)
    with_path = simulate(layout, reqs, hw, Bounds(3000, 60, 250), 8192, path)
    for cls, added in (("short", 8.0), ("long", 30.0)):  # short prompts colocated, the 20K one to P/D
        a, b = bare.classes[cls], with_path.classes[cls]
        assert b["p95_ttft_ms"] == pytest.approx(a["p95_ttft_ms"] + added)
        assert b["p95_itl_ms"] == pytest.approx(a["p95_itl_ms"]) and b["p95_tpot_ms"] == pytest.approx(
            a["p95_tpot_ms"]
        )
    # a path with a tail: one request in ten 40 ms late instead of 2 moves the short TTFTs' P95, not their P50
    tail = RequestPath((2.0,) * 9 + (40.0,), (), "test", AT, True)
    spread = simulate(layout, reqs, hw, Bounds(3000, 60, 250), 8192, tail).classes["short"]
    assert spread["median_ttft_ms"] == pytest.approx(bare.classes["short"]["median_ttft_ms"] + 2.0)
    assert spread["p95_ttft_ms"] > bare.classes["short"]["p95_ttft_ms"] + 20


def test_at_a_time_scale_the_path_is_in_the_benchs_simulated_ms_and_says_its_wall_figure() -> None:
    # time scale 4: a client TTFT of 4 x 16 ms of engine plus 8 ms of wall path reads 18 ms once divided
    # by 4 (as the bench divides its own): the path's sample is 2 simulated ms, the wall 8 ms / 4
    lab = deltas(_snap(3), _snap(23))
    colo = route_figures("colocated", [(4 * 0.016 + 0.008) / 4] * 20, lab)
    path, _ = measured([colo], AT, "g", time_scale=4)
    assert path.colocated_ms == pytest.approx((2.0,) * 20) and path.time_scale == 4
    assert "simulated ms at time scale 4: the path's wall ms / 4 (wall means 8.0 / 0.0 ms)" in path.text()
    assert of_doc(path.doc()) == path
    given = of_profile(8.0, 12.0, "measured by hand", "lab-cross-time4", time_scale=4)  # wall ms given
    assert given.seconds("colocated") == pytest.approx(0.002) and given.seconds("disagg") == pytest.approx(
        0.003
    )
    assert of_doc({k: v for k, v in path.doc().items() if k != "time_scale"}).time_scale == 1  # older files
