"""Estimates how long a refused client should wait before retrying: from recent slot hold
times, how long the current holders have held their slots, and the queue ahead."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence


class HoldTimeEstimator:
    """Recent slot hold times (seconds). A slot's typical hold is their upper quartile, not
    their mean: holds mix short answers and long ones, and a client told to come back too
    early only comes back to another 429."""

    __slots__ = ("_initial_s", "_ordered", "_recent")

    QUANTILE = 0.75
    MIN_SAMPLES = 4
    INITIAL_S = 5.0  # assumed until MIN_SAMPLES holds are known

    def __init__(self, initial_s: float = INITIAL_S, window: int = 128) -> None:
        self._initial_s = initial_s
        self._recent: deque[float] = deque(maxlen=window)
        self._ordered: list[float] | None = None  # sorted when first asked after a change

    @property
    def typical_s(self) -> float:
        return self._quantile(self.QUANTILE)

    @property
    def median_s(self) -> float:
        """The median hold: what a node just granted is expected to be held."""
        return self._quantile(0.5)

    @property
    def mean_s(self) -> float:
        """The mean hold: what sizing the pool needs (the load in node-seconds)."""
        if len(self._recent) < self.MIN_SAMPLES:
            return self._initial_s
        return sum(self._recent) / len(self._recent)

    def _quantile(self, quantile: float) -> float:
        if len(self._recent) < self.MIN_SAMPLES:
            return self._initial_s
        if self._ordered is None:
            self._ordered = sorted(self._recent)  # only when asked: ~128 items
        ordered = self._ordered
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]

    def observe(self, held_s: float) -> None:
        self._recent.append(held_s)
        self._ordered = None

    def retry_after_s(self, *, waiting: int, nodes: int, held_for: Sequence[float] = ()) -> int:
        """Seconds until a slot is likely free for a newcomer: whole, 1..600.

        `nodes` are in service, `held_for` says how long each held one has been held,
        `waiting` how many are queued ahead. A holder is expected to need the typical hold
        time in all (at least a tenth of it more, however long it has run); a free slot is
        free now; past the first slot of each node, every turn takes the typical time again.
        """
        if nodes <= 0:
            return 60
        wait = _wait(self.typical_s, waiting=waiting, nodes=nodes, held_for=held_for)
        return max(1, min(600, math.ceil(wait)))

    def expected_wait_s(self, *, waiting: int, nodes: int, held_for: Sequence[float] = ()) -> float:
        """The same estimate for a prediction: the median hold rather than the cautious
        upper quartile, and not rounded (0 when a slot is free and nobody waits)."""
        if nodes <= 0:
            return math.inf
        return _wait(self.median_s, waiting=waiting, nodes=nodes, held_for=held_for)


def _wait(typical_s: float, *, waiting: int, nodes: int, held_for: Sequence[float]) -> float:
    remaining = sorted(max(typical_s - elapsed, typical_s / 10) for elapsed in held_for[:nodes])
    free_at = [0.0] * (nodes - len(remaining)) + remaining
    turns, slot = divmod(waiting, nodes)
    return free_at[slot] + turns * typical_s
