"""Where a pool's ITL comes from: the instances' histogram deltas over a run, the gap shares, the lines."""

from __future__ import annotations

import math

import pytest

from pdfleet.plan.gaps import component_lines, deltas, engines_verdict, gap_shares, hist_quantile, ttft_lines

ITL = "vllm:inter_token_latency_seconds"


def _s(name: str, host: str, value: float, le: str | None = None) -> dict[str, object]:
    labels = {"pool": "colocated", "role": "colocated", "host": host, **({"le": le} if le else {})}
    return {"name": name, "labels": labels, "value": value}


def _snap(n: float) -> list[dict[str, object]]:
    return [
        s
        for h in ("a", "b")
        for s in (
            _s(f"{ITL}_bucket", h, 9 * n, "0.01"),
            _s(f"{ITL}_bucket", h, 10 * n, "+Inf"),
            _s(f"{ITL}_count", h, 10 * n),
            _s(f"{ITL}_sum", h, 0.08 * n),
        )
    ]


def test_deltas_are_the_increase_over_the_run_summed_over_hosts() -> None:
    d = deltas(_snap(1), _snap(3))
    assert d[(ITL, "colocated", "colocated")] == pytest.approx(
        {"0.01": 36.0, "+Inf": 40.0, "count": 40.0, "sum": 0.32}
    )
    assert hist_quantile({"0.01": 9.0, "0.1": 10.0, "+Inf": 10.0, "count": 10.0}, 0.5) <= 0.01


def test_gap_shares_count_long_gaps_and_tokens_read_together() -> None:
    over, under, mean = gap_shares([[0.005, 0.02], [0.0005, 0.0145]])
    assert (over, under) == (50.0, 25.0) and math.isclose(mean, 10.0)
    assert all(math.isnan(x) for x in gap_shares([]))


def test_component_lines_put_prediction_instances_and_client_side_by_side() -> None:
    out = component_lines("colocated", [[0.008, 0.012]], deltas(_snap(1), _snap(3)), [[0.0005, 0.02]])
    assert out[0] == "colocated  gaps over 10 ms / mean: predicted 50.0% / 10.00 ms"
    assert out[1].endswith("lab colocated instances' own gaps (simulated): 10.0% / 8.00 ms")
    assert out[-1].endswith("the model, not only delivery")  # 10.0% over 10 ms against 50.0% predicted
    assert out[-2].endswith("lab client gaps: 50.0% / 10.25 ms; under 1 ms (tokens read together): 50.0%")
    assert len(component_lines("disagg", [], {}, [])) == 2  # no snapshots: prediction and client only


def test_the_engines_verdict_reads_the_instances_own_gaps_against_the_model() -> None:
    assert engines_verdict(1.7, 10.35, 1.7, 10.34).startswith("the instances made the predicted gaps")
    assert engines_verdict(1.7, 10.35, 3.0, 10.34).endswith("the model, not only delivery")  # share
    assert engines_verdict(1.7, 10.35, 1.7, 10.9).endswith("the model, not only delivery")  # mean


def test_ttft_lines_tell_the_requests_path_from_the_model() -> None:
    ttft = "vllm:time_to_first_token_seconds"
    lab = {(ttft, "colocated", "colocated"): {"count": 4.0, "sum": 0.092, "0.04": 4.0, "+Inf": 4.0}}
    out = ttft_lines("colocated", [0.02, 0.025], lab, [0.028, 0.032], "routed/colocated")
    assert out[0] == "routed/colocated TTFT mean: predicted 22.5 ms, lab client 30.0 ms"
    assert out[1].endswith("lab colocated instances' own TTFT mean (simulated): 23.0 ms")
    assert out[2].endswith(
        "the client's +7.0 ms is the request's path (gateway, TLS, network, client), not the model"
    )
    far = ttft_lines("colocated", [0.015], lab, [0.03])
    assert far[-1].endswith("the instances' own TTFT differs from the model's by over 10%: the model")
    assert len(ttft_lines("disagg", [0.5], {}, [0.6])) == 1  # no snapshots: prediction and client only
