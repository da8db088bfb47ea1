"""Arrival schedules: seeded, reproducible, at the intended rate; closed-loop offsets."""

from __future__ import annotations

import statistics

import pytest

from pdfleet.bench.arrivals import even_offsets, gamma_starts, poisson_starts, stagger_offsets


def test_poisson_starts_are_reproducible_from_the_seed() -> None:
    """The same seed gives the same schedule (every target of a run sees the same one); another, another."""
    assert poisson_starts(30.0, 10.0, seed=7) == poisson_starts(30.0, 10.0, seed=7)
    assert poisson_starts(30.0, 10.0, seed=7) != poisson_starts(30.0, 10.0, seed=8)


@pytest.mark.parametrize(("rate", "horizon"), [(30.5, 16.0), (296.9, 8.0), (2.0, 0.7), (0.1, 1.0)])
def test_poisson_starts_have_the_intended_count_sorted_within_the_horizon(
    rate: float, horizon: float
) -> None:
    """Conditioned on its count: exactly round(rate * horizon) starts, so the mean rate is the rate."""
    starts = poisson_starts(rate, horizon, seed=1)
    assert len(starts) == round(rate * horizon)
    assert starts == sorted(starts)
    assert all(0.0 <= s < horizon for s in starts)


def test_poisson_gaps_are_exponential_like() -> None:
    """Mean gap 1/rate and coefficient of variation ~1 (a periodic schedule would have 0)."""
    rate = 100.0
    starts = poisson_starts(rate, 200.0, seed=3)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.02)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.05)


def test_stagger_offsets_are_seeded_within_the_stagger() -> None:
    """One offset per worker in [0, stagger), reproducible; all zero (a burst) when stagger is 0."""
    offsets = stagger_offsets(50, 1.6, seed=50)
    assert offsets == stagger_offsets(50, 1.6, seed=50)
    assert len(offsets) == 50 and all(0.0 <= o < 1.6 for o in offsets)
    assert len(set(offsets)) == 50
    assert stagger_offsets(4, 0.0, seed=4) == [0.0, 0.0, 0.0, 0.0]


def test_even_offsets_spread_workers_evenly() -> None:
    """Worker i starts at spread * i / workers."""
    assert even_offsets(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert even_offsets(0, 2.0) == []


def test_gamma_starts_have_the_rate_and_the_seed() -> None:
    starts = gamma_starts(4000, rate=10.0, burstiness=1.0, seed=3)
    assert starts[0] == 0.0 and starts == sorted(starts)
    assert starts[-1] / 3999 == pytest.approx(0.1, rel=0.05)  # mean gap 1 / rate
    assert starts == gamma_starts(4000, 10.0, 1.0, 3) and starts != gamma_starts(4000, 10.0, 1.0, 4)
    bursty = gamma_starts(4000, 10.0, 0.25, 3)
    gaps = [b - a for a, b in zip(bursty, bursty[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    cv2 = sum((g - mean) ** 2 for g in gaps) / len(gaps) / mean**2
    assert cv2 == pytest.approx(4.0, rel=0.2)  # gamma shape k: squared coefficient of variation 1/k
    assert gamma_starts(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]
