"""Retry-After from hold times, the current holders and the queue ahead."""

from __future__ import annotations

import pytest

from router.gate.hold_times import HoldTimeEstimator


def estimator(mean_s: float) -> HoldTimeEstimator:
    hold = HoldTimeEstimator(initial_s=mean_s, alpha=1.0)
    hold.observe(mean_s)
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
