"""Split streamed text into plain text and markers, holding back possible marker starts.

The parsers are state machines whose markers depend on the state, so the scanner is
asked for "the next marker out of this set" each time. Text that might be the start of
a marker stays in the buffer until more text decides it; everything before it is
handed out at once. Work per delta is proportional to the delta plus the held tail.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Markers:
    """A set of markers looked for together; build once per parser state."""

    markers: tuple[str, ...]
    _starts: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Longest first, so a marker that extends another one wins at the same position.
        ordered = tuple(sorted(set(self.markers), key=len, reverse=True))
        object.__setattr__(self, "markers", ordered)
        firsts = "".join(sorted({m[0] for m in ordered}))
        starts = re.compile(f"[{re.escape(firsts)}]") if firsts else None
        object.__setattr__(self, "_starts", starts)

    def find(self, text: str, pos: int) -> tuple[int, str | None]:
        """First marker at or after `pos`: `(index, marker)`.

        When no whole marker occurs, `(index, None)` where `index` is where a possible
        partial marker at the end of `text` begins (or `len(text)` if there is none).
        """
        starts = self._starts
        end = len(text)
        if starts is None:
            return end, None
        match = starts.search(text, pos)
        while match is not None:
            i = match.start()
            for marker in self.markers:
                if text.startswith(marker, i):
                    return i, marker
            tail = end - i
            for marker in self.markers:
                if tail < len(marker) and marker.startswith(text[i:]):
                    return i, None
            match = starts.search(text, i + 1)
        return end, None


class MarkerScanner:
    """A buffer of undecided text that yields plain text and markers on request."""

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = ""
        self._pos = 0

    def push(self, text: str) -> None:
        """Append the next delta (dropping the part already handed out)."""
        self._buf = self._buf[self._pos :] + text if self._pos else self._buf + text
        self._pos = 0

    def next(self, markers: Markers) -> tuple[str, str | None]:
        """Take `(plain_text, marker)`; `marker` is None when none is complete yet.

        With no marker, `plain_text` is everything known not to start one and the
        possible marker prefix stays buffered for the next `push`.
        """
        start = self._pos
        index, marker = markers.find(self._buf, start)
        if marker is None:
            self._pos = index
            return self._buf[start:index], None
        self._pos = index + len(marker)
        return self._buf[start:index], marker

    def unread(self, marker: str) -> None:
        """Put back the marker just taken, to be scanned again under other markers."""
        self._pos -= len(marker)

    def drain(self) -> str:
        """Everything still buffered, as plain text (end of stream)."""
        rest = self._buf[self._pos :]
        self._buf = ""
        self._pos = 0
        return rest
