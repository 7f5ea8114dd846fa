"""Log lines about a condition that persists (a node of the wrong release, found at every
probe): the first is logged, repeats are counted and logged with their count now and then,
and a change of the condition is logged at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _Seen:
    text: str
    said_at: float
    unsaid: int = 0


class RepeatedLines:
    """Per subject (a node id), the last line and how often it recurred unsaid."""

    def __init__(
        self, *, every_s: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._every_s = every_s
        self._clock = clock
        self._seen: dict[str, _Seen] = {}

    def due(self, subject: str, text: str) -> int | None:
        """None if the line is not to be logged now; else how many times it recurred since it
        was last logged (0: new, or changed)."""
        now = self._clock()
        seen = self._seen.get(subject)
        if seen is None or seen.text != text:
            self._seen[subject] = _Seen(text, now)
            return 0
        seen.unsaid += 1
        if now - seen.said_at < self._every_s:
            return None
        repeats, seen.unsaid, seen.said_at = seen.unsaid, 0, now
        return repeats

    def clear(self, subject: str) -> None:
        """The condition is over: its next occurrence is new."""
        self._seen.pop(subject, None)
