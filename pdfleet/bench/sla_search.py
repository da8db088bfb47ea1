"""Which rate `invoke bench --sweep` tries next, as a pure function of the rates tried so far.

The search is `vllm bench sweep serve_sla`'s: every tried rate has a margin that grows with the rate
(here the attainment target minus the measured attainment, in percentage points; a rate meets the SLO
when its margin is <= 0). Until a rate misses, the rate doubles (halves until one meets); then the next
rate is where the margin, interpolated between the highest rate that met and the lowest above it that
missed, crosses zero. vLLM fits a monotone spline through every point; this takes the straight line
between the two points that bracket the root. The guess is kept inside the bracket's middle 80 %, so every
step narrows it by a tenth at least, and the search ends when the bracket is within `tolerance` of its
upper end (or the caller's step budget runs out).

Invariant: `next_rate` never proposes a rate already tried, and once a bracket exists it only proposes
rates strictly inside it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

INSIDE = 0.1  # an interpolated guess stays this share of the bracket away from either end


def margin(attainment_pct: float, target_pct: float) -> float:
    """How far a run missed the attainment target, in percentage points (<= 0: it met it)."""
    return target_pct - attainment_pct


def bracket(history: Mapping[float, float]) -> tuple[float | None, float | None]:
    """The highest rate that met the SLO, and the lowest rate above it that missed (None where none).

    A noisy history (a higher rate met where a lower one missed) keeps the highest rate that met: the
    search goes on above it, as vLLM's "max passing" does.
    """
    met = [r for r, m in history.items() if m <= 0]
    lo = max(met, default=None)
    missed = [r for r, m in history.items() if m > 0 and (lo is None or r > lo)]
    return lo, min(missed, default=None)


def _round(rate: float) -> float:
    """Three significant digits: a rate an operator can read and pass back as --rate."""
    if rate <= 0:
        return rate
    digits = 2 - math.floor(math.log10(rate))
    return round(rate, digits)


def next_rate(history: Mapping[float, float], start: float, tolerance: float = 0.05) -> float | None:
    """The next rate to try (requests/s), or None when the bracket is narrow enough.

    `history` maps each rate tried to its margin; `start` is the first rate (the plan's --rate).
    """
    if not history:
        return start
    lo, hi = bracket(history)
    if hi is None:
        assert lo is not None  # a history with no rate missing has a rate that met
        return 2 * lo
    if lo is None:
        return _round(hi / 2)
    if hi - lo <= tolerance * hi:
        return None
    m_lo, m_hi = history[lo], history[hi]
    guess = lo + (hi - lo) * (-m_lo) / (m_hi - m_lo)  # m_hi > 0 >= m_lo: the denominator is positive
    low, high = lo + INSIDE * (hi - lo), hi - INSIDE * (hi - lo)
    exact = min(max(guess, low), high)
    rate = _round(exact)
    return rate if lo < rate < hi else exact  # a bracket narrower than the rounding: the exact value
