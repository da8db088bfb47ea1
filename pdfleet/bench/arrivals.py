"""When streams start: seeded open-loop (Poisson) schedules and closed-loop workers' start offsets.

Every schedule is a plain list of seconds from the run's start, reproducible from its seed, so that every
target (or pool) of one run can be given exactly the same arrivals.
"""

from __future__ import annotations

import random


def poisson_starts(rate: float, horizon: float, seed: int) -> list[float]:
    """Start times (s from the run's start) of a Poisson process of `rate`/s over [0, horizon).

    Drawn as a Poisson process conditioned on its count: round(rate * horizon) times, uniform and
    sorted. Gaps are still independent-looking (exponential for large counts), but a short run is
    not ±1/sqrt(count) off the intended load just by the luck of its seed.
    """
    rng = random.Random(seed)
    return sorted(rng.uniform(0, horizon) for _ in range(round(rate * horizon)))


def stagger_offsets(workers: int, stagger: float, seed: int) -> list[float]:
    """Closed loop: each worker's first start, uniform in [0, stagger) (seeded); all 0 when stagger is 0.

    Equal-length streams keep either pattern in phase for a whole run: `workers` fixed phases, or bursts
    of `workers` requests at a time.
    """
    rng = random.Random(seed)
    return [rng.uniform(0, stagger) if stagger > 0 else 0.0 for _ in range(workers)]


def even_offsets(workers: int, spread: float) -> list[float]:
    """Closed loop: workers' first starts evenly spread over [0, spread), the steady state of a long run."""
    return [spread * i / workers for i in range(workers)]


def gamma_starts(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Start times of `n` requests at `rate`/s as `vllm bench serve` draws them: gamma inter-arrivals.

    Shape `burstiness` (1 = Poisson; lower is burstier), scale 1 / (rate * burstiness), so the mean gap is
    1 / rate; the first request starts at 0. An infinite rate starts everything at once.
    """
    if n <= 0:
        return []
    if rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    theta = 1.0 / (rate * burstiness)
    out, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out
