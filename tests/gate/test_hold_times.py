"""Retry-After from hold times, the current holders and the queue ahead."""

from __future__ import annotations

import pytest

from router.gate.hold_times import HoldTimeEstimator


def estimator(typical_s: float) -> HoldTimeEstimator:
    hold = HoldTimeEstimator()
    for _ in range(8):
        hold.observe(typical_s)
    return hold


@pytest.mark.parametrize(
    ("held_for", "waiting", "nodes", "expected"),
    [
        ([], 0, 2, 1),  # a free node: retry at once (the minimum)
        ([1.0], 0, 2, 1),  # one of two held: the other is free
        ([2.0, 3.0], 0, 2, 7),  # both held for ~10 s streams: the first ends in ~7 s
        ([2.0, 3.0], 1, 2, 8),  # one waiting ahead takes that slot: the second, ~8 s
        ([2.0, 3.0], 2, 2, 17),  # two ahead: the first slot's next turn
        ([12.0, 30.0], 0, 2, 1),  # overdue holders: a tenth of the mean, at least a second
    ],
)
def test_the_wait_follows_the_holders_and_the_queue(
    held_for: list[float], waiting: int, nodes: int, expected: int
) -> None:
    assert estimator(10.0).retry_after_s(waiting=waiting, nodes=nodes, held_for=held_for) == (
        expected
    )


def test_bounds() -> None:
    assert estimator(10.0).retry_after_s(waiting=0, nodes=0) == 60
    assert estimator(100.0).retry_after_s(waiting=1000, nodes=1, held_for=[0.0]) == 600


def test_the_typical_hold_is_the_upper_quartile_of_recent_holds() -> None:
    hold = HoldTimeEstimator(initial_s=5.0)
    assert hold.typical_s == 5.0, "too few holds seen: the initial guess"
    for held_s in [0.1] * 6 + [4.0, 4.0]:  # short answers and long ones
        hold.observe(held_s)
    assert hold.typical_s == 4.0, "not dragged down to the mean (about 1.1 s)"
    for _ in range(200):
        hold.observe(2.0)
    assert hold.typical_s == 2.0, "old holds age out"


def test_the_expected_wait_is_the_median_hold_unrounded() -> None:
    hold = HoldTimeEstimator()
    for held_s in (1.0, 1.0, 1.0, 9.0, 9.0):  # median 1 s, upper quartile 9 s
        hold.observe(held_s)
    assert hold.expected_wait_s(waiting=0, nodes=2, held_for=[]) == 0.0
    assert hold.expected_wait_s(waiting=0, nodes=1, held_for=[0.25]) == pytest.approx(0.75)
    assert hold.retry_after_s(waiting=0, nodes=1, held_for=[0.25]) == 9
    assert hold.expected_wait_s(waiting=1, nodes=1, held_for=[0.25]) == pytest.approx(1.75)
    assert hold.expected_wait_s(waiting=0, nodes=0) == float("inf")
