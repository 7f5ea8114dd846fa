"""The online fits: a line found from noisy observations, recent ones weighing more, the
prior until enough are seen, and never a time that shrinks with more work."""

from __future__ import annotations

import random

import pytest

from router.objectives.fits import Average, Line, LinearFit

PRIOR = Line(0.05, 0.001)


def test_a_fit_is_its_prior_until_it_has_seen_enough() -> None:
    fit = LinearFit()
    assert fit.predict(1000, PRIOR) == pytest.approx(1.05)
    fit.add(1000, 9.0)
    fit.add(2000, 9.0)
    assert fit.predict(1000, PRIOR) == pytest.approx(1.05)


def test_a_fit_finds_the_line_through_noisy_observations() -> None:
    rng = random.Random(7)
    fit = LinearFit(memory=200)
    for _ in range(400):
        x = rng.uniform(0, 8000)
        fit.add(x, 0.02 + 0.0001 * x + rng.gauss(0, 0.01))
    line = fit.line(PRIOR)
    assert line.slope == pytest.approx(0.0001, rel=0.05)
    assert line.intercept == pytest.approx(0.02, abs=0.01)


def test_recent_observations_outweigh_old_ones() -> None:
    fit = LinearFit(memory=20)
    for x in range(200):
        fit.add(x % 10, 0.010)
    for x in range(60):
        fit.add(x % 10, 0.030)  # the server slowed down
    assert fit.predict(5, PRIOR) == pytest.approx(0.030, rel=0.1)


def test_one_x_only_learns_the_level_and_keeps_the_prior_slope() -> None:
    fit = LinearFit()
    for _ in range(10):
        fit.add(1, 0.020)  # always one request running
    assert fit.predict(1, PRIOR) == pytest.approx(0.020)
    assert fit.predict(11, PRIOR) == pytest.approx(0.020 + 10 * PRIOR.slope)


def test_a_time_never_shrinks_with_more_work() -> None:
    fit = LinearFit()
    for x, y in [(1, 0.5), (2, 0.4), (3, 0.3), (4, 0.2)]:
        fit.add(x, y)
    assert fit.line(PRIOR).slope == 0.0
    assert fit.predict(100, PRIOR) >= 0.0


def test_an_average_weighs_its_first_observations_evenly_then_the_recent_ones() -> None:
    average = Average(memory=10)
    assert average.get(0.5) == 0.5
    for y in (1.0, 2.0, 3.0):
        average.add(y)
    assert average.get(0.5) == pytest.approx(2.0)
    for _ in range(100):
        average.add(10.0)
    assert average.get(0.5) == pytest.approx(10.0, rel=0.01)
