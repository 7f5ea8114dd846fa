"""Repeated log lines: the first said, repeats counted and said now and then, a change at once."""

from __future__ import annotations

from router.node_lifecycle.repeats import RepeatedLines


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_line_is_said_once_then_with_its_count_every_period() -> None:
    clock = Clock()
    lines = RepeatedLines(every_s=300, clock=clock)
    assert lines.due("n", "mismatch") == 0
    for _ in range(3):
        clock.now += 2
        assert lines.due("n", "mismatch") is None
    clock.now = 301
    assert lines.due("n", "mismatch") == 4
    clock.now += 2
    assert lines.due("n", "mismatch") is None


def test_a_changed_or_cleared_line_is_said_at_once() -> None:
    lines = RepeatedLines(every_s=300, clock=Clock())
    assert lines.due("n", "runs 0.1.5") == 0
    assert lines.due("n", "runs 0.1.7") == 0
    assert lines.due("m", "runs 0.1.7") == 0, "each node on its own"
    lines.clear("n")
    assert lines.due("n", "runs 0.1.7") == 0
