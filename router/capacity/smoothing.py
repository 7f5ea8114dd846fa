"""Figures followed over time, each in constant time and memory per reading, weighted towards
the last `window_s` seconds (an exponential moving average in time, not in readings: readings
that come late or twice in a row weigh for the time they stood for, not once each)."""

from __future__ import annotations

import math


class Level:
    """The time average of a level read now and then (requests running, slots busy): each
    reading is taken to have held since the one before."""

    __slots__ = ("_at", "_window_s", "value")

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._at: float | None = None
        self.value = 0.0

    def read(self, level: float, at: float) -> None:
        if self._at is None:
            self.value, self._at = level, at
            return
        elapsed = at - self._at
        if elapsed <= 0:
            return
        self.value += (1.0 - math.exp(-elapsed / self._window_s)) * (level - self.value)
        self._at = at

    @property
    def known(self) -> bool:
        return self._at is not None


class CounterRate:
    """The rate of a counter that only grows (a server's prompt tokens so far), from its
    readings: a counter that went down was restarted, and counts from there."""

    __slots__ = ("_at", "_last", "_rate")

    def __init__(self, window_s: float) -> None:
        self._rate = Level(window_s)
        self._at: float | None = None
        self._last = 0.0

    def read(self, count: float, at: float) -> None:
        if self._at is not None and at > self._at:
            grown = count - self._last if count >= self._last else count
            self._rate.read(grown / (at - self._at), at)
        if self._at is None or at > self._at:
            self._at, self._last = at, count

    @property
    def per_second(self) -> float:
        return self._rate.value

    @property
    def known(self) -> bool:
        return self._rate.known
