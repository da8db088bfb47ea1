"""Whether a simulator kept its schedule: how far its simulated clock fell behind the wall clock in a window.

From two snapshots of its `pdfleet_sim_*` gauges (and vLLM's queue gauges), taken with the wall time
"t", the simulator's CPU seconds "sim_cpu", and the client's counts "events" (SSE events, `[DONE]`
included) and "done" (finished streams):

    drift = (wall seconds the simulated clock fell behind during the window) / (window wall seconds)
          = (Δ lag of the latest step + Δ schedule given up by clock jumps) / window
"""

from __future__ import annotations

from collections.abc import Mapping

ON_SCHEDULE = 0.05  # drift under which the simulator is on schedule


def _delta(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float:
    return after[name] - before[name]


def clock_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """The simulator's drift, lag, step rate, delivered tokens and CPU in the window between two snapshots."""
    window = _delta(before, after, "t")
    lost = _delta(before, after, "pdfleet_sim_lag_seconds") + _delta(
        before, after, "pdfleet_sim_resync_lost_wall_seconds"
    )
    busy_sim = _delta(before, after, "pdfleet_sim_busy_simulated_seconds")
    steps = _delta(before, after, "pdfleet_sim_steps")
    tokens = _delta(before, after, "events") - _delta(before, after, "done")  # [DONE] is not a token
    return {
        "window_s": window,
        "drift": lost / window,
        "lag_ms_at_end": 1e3 * after["pdfleet_sim_lag_seconds"],
        "running_at_end": after["vllm:num_requests_running"],
        "waiting_at_end": after["vllm:num_requests_waiting"],
        "steps_per_s": steps / window,
        "mean_step_ms_simulated": 1e3 * busy_sim / max(steps, 1),
        "tokens_per_s_received": tokens / window,
        "busy_simulated_s": busy_sim,
        "busy_wall_s": _delta(before, after, "pdfleet_sim_busy_wall_seconds"),
        "resyncs_in_window": _delta(before, after, "pdfleet_sim_resyncs"),
        "max_lag_ms_ever": 1e3 * after["pdfleet_sim_max_lag_seconds"],
        "sim_cpu_util": _delta(before, after, "sim_cpu") / window,
        "completed_requests": float(after["done"]),
    }
