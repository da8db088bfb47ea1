"""The sweep's search (pdfleet.bench.sla_search): each branch of `next_rate` on hand-built histories."""

from __future__ import annotations

import pytest

from pdfleet.bench.sla_search import bracket, margin, next_rate


def test_the_first_rate_is_the_plans() -> None:
    assert next_rate({}, 3.0) == 3.0


def test_the_rate_doubles_while_every_rate_meets_the_slo() -> None:
    assert next_rate({2.0: -10.0, 4.0: -8.0}, 2.0) == 8.0


def test_the_rate_halves_while_every_rate_misses() -> None:
    assert next_rate({8.0: 30.0}, 8.0) == 4.0
    assert next_rate({8.0: 30.0, 4.0: 12.0}, 8.0) == 2.0


def test_between_a_met_and_a_missed_rate_the_margin_is_interpolated_to_zero() -> None:
    # met at 4 (margin -10), missed at 8 (margin +30): the line crosses 0 a quarter of the way, at 5
    assert next_rate({4.0: -10.0, 8.0: 30.0}, 4.0) == 5.0


def test_an_interpolated_rate_stays_inside_the_middle_of_the_bracket() -> None:
    # the line would cross at 4.04 (a hair above the met rate): kept a tenth of the bracket away
    assert next_rate({4.0: -0.1, 8.0: 9.9}, 4.0) == pytest.approx(4.4)
    assert next_rate({4.0: -99.0, 8.0: 1.0}, 4.0) == pytest.approx(7.6)


def test_the_search_ends_when_the_bracket_is_within_the_tolerance() -> None:
    assert next_rate({4.0: -1.0, 4.1: 2.0}, 4.0, tolerance=0.05) is None
    assert next_rate({4.0: -1.0, 4.5: 2.0}, 4.0, tolerance=0.05) is not None


def test_a_noisy_history_keeps_the_highest_rate_that_met() -> None:
    # 6 missed, 8 met, 16 missed: the bracket is (8, 16), not (4, 6)
    history = {4.0: -5.0, 6.0: 1.0, 8.0: -2.0, 16.0: 6.0}
    assert bracket(history) == (8.0, 16.0)
    rate = next_rate(history, 4.0)
    assert rate is not None and 8.0 < rate < 16.0


def test_proposed_rates_are_never_ones_already_tried_and_converge() -> None:
    # a pool whose attainment falls linearly from 100 % at 5 req/s to 0 at 15: the 90 % target is met up
    # to 6 req/s exactly
    history: dict[float, float] = {}
    rate = next_rate(history, 1.0)
    for _ in range(12):
        assert rate is not None and rate not in history
        attained = max(0.0, min(100.0, 100.0 * (15.0 - rate) / 10.0))
        history[rate] = margin(attained, 90.0)
        rate = next_rate(history, 1.0)
        if rate is None:
            break
    lo, hi = bracket(history)
    assert rate is None and lo is not None and hi is not None
    assert lo <= 6.0 <= hi and hi - lo <= 0.05 * hi
    assert len(history) <= 8


def test_margin_is_the_shortfall_in_percentage_points() -> None:
    assert margin(85.0, 90.0) == 5.0
    assert margin(100.0, 90.0) == -10.0
