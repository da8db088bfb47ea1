"""The simulator's drift and figures from two hand-built snapshots."""

from __future__ import annotations

import pytest

from pdfleet.bench.sim_clock import clock_figures


def _snapshot(
    t: float, lag: float, lost: float, steps: float, busy: float, events: float, done: float
) -> dict:
    return {
        "t": t,
        "pdfleet_sim_lag_seconds": lag,
        "pdfleet_sim_resync_lost_wall_seconds": lost,
        "pdfleet_sim_busy_simulated_seconds": busy,
        "pdfleet_sim_busy_wall_seconds": busy + 0.01,
        "pdfleet_sim_steps": steps,
        "pdfleet_sim_resyncs": 1.0,
        "pdfleet_sim_max_lag_seconds": 0.05,
        "vllm:num_requests_running": 300.0,
        "vllm:num_requests_waiting": 2.0,
        "sim_cpu": 10.0 + t / 2,
        "events": events,
        "done": done,
    }


def test_drift_is_the_schedule_lost_per_wall_second() -> None:
    """10 s window; the lag grew 0.2 s and clock jumps gave up 0.3 s: drift 5%."""
    before = _snapshot(100.0, 0.1, 1.0, 1000, 20.0, 5000, 40)
    after = _snapshot(110.0, 0.3, 1.3, 1700, 30.0, 215_050, 90)
    fig = clock_figures(before, after)
    assert fig["window_s"] == pytest.approx(10.0)
    assert fig["drift"] == pytest.approx(0.05)
    assert fig["lag_ms_at_end"] == pytest.approx(300.0)
    assert fig["steps_per_s"] == pytest.approx(70.0)
    assert fig["mean_step_ms_simulated"] == pytest.approx(1e3 * 10.0 / 700)
    # 210 050 events minus 50 [DONE]s: 210 000 tokens over 10 s
    assert fig["tokens_per_s_received"] == pytest.approx(21_000.0)
    assert fig["busy_simulated_s"] == pytest.approx(10.0)
    assert fig["resyncs_in_window"] == 0.0
    assert fig["max_lag_ms_ever"] == pytest.approx(50.0)
    assert fig["sim_cpu_util"] == pytest.approx(0.5)
    assert (fig["running_at_end"], fig["waiting_at_end"], fig["completed_requests"]) == (300.0, 2.0, 90.0)


def test_a_clock_that_catches_up_has_negative_drift() -> None:
    """The latest step's lag shrank: the window lost less than nothing."""
    fig = clock_figures(_snapshot(0, 0.02, 0, 0, 0, 0, 0), _snapshot(10, 0.01, 0, 0, 0, 0, 0))
    assert fig["drift"] == pytest.approx(-0.001)
    assert fig["mean_step_ms_simulated"] == 0.0  # no step: no division by zero
