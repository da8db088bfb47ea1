"""The simulated clock: simulated seconds are wall seconds divided by the time scale."""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest

from pdfleet.sim.clock import SimClock


class _Loop:
    """An event loop's clock only, set by hand."""

    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t


def test_simulated_time_runs_at_one_over_the_scale() -> None:
    loop = _Loop(100.0)
    clock = SimClock(0.5)
    clock.start(cast(asyncio.AbstractEventLoop, loop))
    assert clock.now() == 0.0
    loop.t = 101.0
    assert clock.now() == pytest.approx(2.0)  # one wall second = two simulated ones at scale 0.5
    assert clock.wall_at(4.0) == pytest.approx(102.0)


def test_sleep_waits_the_scaled_duration_and_never_a_negative_one() -> None:
    clock = SimClock(0.001)

    async def run() -> float:
        clock.start(asyncio.get_running_loop())
        t0 = time.monotonic()
        await clock.sleep(50.0)  # 50 ms of wall time
        await clock.sleep(-1.0)
        return time.monotonic() - t0

    # unscaled, the sleep would take 50 s: the bound leaves seconds for a process starved beside the lab
    assert 0.045 <= asyncio.run(run()) < 10.0
