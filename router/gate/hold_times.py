"""Estimates how long a client should wait before retrying, from recent slot hold times."""

from __future__ import annotations

import math


class HoldTimeEstimator:
    """Exponentially weighted mean of slot hold times (seconds)."""

    __slots__ = ("_alpha", "_mean")

    def __init__(self, initial_s: float = 5.0, alpha: float = 0.2) -> None:
        self._mean = initial_s
        self._alpha = alpha

    def observe(self, held_s: float) -> None:
        self._mean += self._alpha * (held_s - self._mean)

    def retry_after_s(self, *, waiting: int, nodes: int) -> int:
        """Seconds until the queue ahead of a newcomer has likely drained: whole, 1..600."""
        if nodes <= 0:
            return 60
        wait = self._mean * (waiting + 1) / nodes
        return max(1, min(600, math.ceil(wait)))
