"""Figures followed over time: averages in time (not in readings), counters' rates through
a restart."""

from __future__ import annotations

import pytest

from router.capacity.smoothing import CounterRate, Level


def test_a_level_read_often_or_seldom_comes_to_the_same_average() -> None:
    often, seldom = Level(window_s=60), Level(window_s=60)
    for second in range(0, 600):
        often.read(4.0 if second < 300 else 10.0, float(second))
    for second in range(0, 600, 30):
        seldom.read(4.0 if second < 300 else 10.0, float(second))
    seldom.read(10.0, 599.0)
    assert often.value == pytest.approx(10.0, abs=0.1)
    assert seldom.value == pytest.approx(often.value, abs=0.1)


def test_a_level_follows_a_step_within_its_window() -> None:
    level = Level(window_s=60)
    level.read(0.0, 0.0)
    level.read(10.0, 60.0)  # one window: about two thirds of the way
    assert level.value == pytest.approx(10 * (1 - 1 / 2.718281828), rel=1e-3)
    level.read(99.0, 60.0)  # a second reading at the same time changes nothing
    assert level.value == pytest.approx(6.3212, rel=1e-3)


def test_a_counter_rate_is_its_growth_per_second_and_survives_a_restart() -> None:
    rate = CounterRate(window_s=10)
    assert not rate.known
    for second in range(0, 101):
        rate.read(500.0 * second, float(second))
    assert rate.per_second == pytest.approx(500.0)
    rate.read(750.0, 101.5)  # restarted: counts from 0 again, 750 in one and a half seconds
    assert rate.per_second == pytest.approx(500.0, rel=0.01)
    assert rate.known
