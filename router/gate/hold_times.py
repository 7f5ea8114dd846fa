"""Estimates how long a refused client should wait before retrying: from recent slot hold
times, how long the current holders have held their slots, and the queue ahead."""

from __future__ import annotations

import math
from collections.abc import Sequence


class HoldTimeEstimator:
    """Exponentially weighted mean of slot hold times (seconds)."""

    __slots__ = ("_alpha", "_mean")

    def __init__(self, initial_s: float = 5.0, alpha: float = 0.2) -> None:
        self._mean = initial_s
        self._alpha = alpha

    @property
    def mean_s(self) -> float:
        return self._mean

    def observe(self, held_s: float) -> None:
        self._mean += self._alpha * (held_s - self._mean)

    def retry_after_s(self, *, waiting: int, nodes: int, held_for: Sequence[float] = ()) -> int:
        """Seconds until a slot is likely free for a newcomer: whole, 1..600.

        `nodes` are in service, `held_for` says how long each held one has been held,
        `waiting` how many are queued ahead. A holder is expected to need the mean hold
        time in all (at least a tenth of it more, however long it has run); a free slot is
        free now; past the first slot of each node, every turn takes the mean again.
        """
        if nodes <= 0:
            return 60
        mean = self._mean
        remaining = sorted(max(mean - elapsed, mean / 10) for elapsed in held_for[:nodes])
        free_at = [0.0] * (nodes - len(remaining)) + remaining
        turns, slot = divmod(waiting, nodes)
        wait = free_at[slot] + turns * mean
        return max(1, min(600, math.ceil(wait)))
