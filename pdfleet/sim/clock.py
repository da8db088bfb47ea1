"""The simulated clock: simulated seconds since start, paced on the event loop's wall clock.

One simulated second takes `time_scale` wall seconds. Everything the simulator reports or is configured
with (metrics, logs, lease timeouts, the log interval) is in SIMULATED seconds; only sleeps and step
deadlines are converted to wall time, here.
"""

from __future__ import annotations

import asyncio


class SimClock:
    """Simulated time over an asyncio loop's monotonic clock; `start` sets simulated time 0."""

    __slots__ = ("scale", "t0", "_loop")

    def __init__(self, time_scale: float) -> None:
        self.scale = time_scale
        self.t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Simulated time 0 is the loop's now."""
        self._loop = loop
        self.t0 = loop.time()

    def now(self) -> float:
        """Simulated seconds since start."""
        assert self._loop is not None
        return (self._loop.time() - self.t0) / self.scale

    def at_wall(self, wall_t: float) -> float:
        """The simulated time at loop time `wall_t` (e.g. when a request's first byte was read)."""
        return (wall_t - self.t0) / self.scale

    def wall_at(self, sim_t: float) -> float:
        """The loop time at which simulated time `sim_t` falls (a step's wall-clock deadline)."""
        return self.t0 + sim_t * self.scale

    async def sleep(self, seconds: float) -> None:
        """Sleep a simulated duration."""
        await asyncio.sleep(max(0.0, seconds * self.scale))
