"""Stop strings applied to a streamed text with the minimum hold-back.

The decode node knows nothing of stop strings, so the gateway applies them to the
detokenized text as vLLM does: output ends just before the earliest occurrence of any
stop string, which is never shown. Text that could still turn out to be the beginning
of a stop string is held back, and released as soon as it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True)
class StopResult:
    """What one `StopMatcher.feed` produced."""

    emit: str  # text safe to send now
    stopped: bool  # a stop string matched: the stream is over, `emit` is its last text
    matched: str | None  # the stop string that matched


class StopMatcher:
    """Applies stop strings to a text stream with minimal hold-back.

    Only the longest suffix of the pending text that is a proper prefix of some stop
    string is held, so the hold-back is shorter than the longest stop string and each
    feed works on the fed text plus that hold-back, never on the whole output.
    Among matches the earliest start wins; at the same start, the shortest stop.
    """

    __slots__ = ("_by_first_char", "_held", "_longest", "_stops", "matched", "stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        # Empty stop strings are ignored, as vLLM does.
        self._stops = tuple(dict.fromkeys(s for s in stops if s))
        self._longest = max((len(s) for s in self._stops), default=0)
        self._by_first_char: dict[str, list[str]] = {}
        for s in self._stops:
            self._by_first_char.setdefault(s[0], []).append(s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> StopResult:
        """Text to emit now, given the next piece of the stream."""
        if self.stopped:
            return StopResult("", True, self.matched)
        if not self._stops:
            return StopResult(text, False, None)
        buf = self._held + text
        start, stop = self._earliest_match(buf)
        pending = self._pending_start(buf, limit=start)
        if stop is not None and pending == start:
            # No longer stop string can still begin before this match: it decides.
            self._held = ""
            self.stopped, self.matched = True, stop
            return StopResult(buf[:start], True, stop)
        self._held = buf[pending:]
        return StopResult(buf[:pending], False, None)

    def flush(self) -> str:
        """End of stream: release the held-back text (up to a match still undecided)."""
        if self.stopped:
            return ""
        buf, self._held = self._held, ""
        start, stop = self._earliest_match(buf)
        if stop is not None:
            # The longer candidate that kept this match undecided can no longer complete.
            self.stopped, self.matched = True, stop
        return buf[:start]

    def _earliest_match(self, buf: str) -> tuple[int, str | None]:
        """Start and stop string of the earliest complete match, or (len(buf), None)."""
        best, found = len(buf), None
        for s in self._stops:
            i = buf.find(s, 0, best + len(s))
            if i != -1 and (i < best or (i == best and found is not None and len(s) < len(found))):
                best, found = i, s
        return best, found

    def _pending_start(self, buf: str, *, limit: int) -> int:
        """Start of the longest suffix of `buf` that is a proper prefix of a stop string
        and begins before `limit`; `limit` if there is none.
        """
        n = len(buf)
        by_first = self._by_first_char
        for i in range(max(0, n - self._longest + 1), min(n, limit)):
            candidates = by_first.get(buf[i])
            if candidates is not None:
                tail = buf[i:]
                for s in candidates:
                    if len(s) > len(tail) and s.startswith(tail):
                        return i
        return limit
