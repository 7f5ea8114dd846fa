"""The driver shared by the markup parsers: scan text into markers and feed a state machine.

A family parser says which markers matter in its current state and what text and
markers do; this base class runs the loop, the end-of-stream flush and the output.
"""

from __future__ import annotations

from router.parsers.base import ParsedDelta, ParsedMessage
from router.parsers.builder import MessageBuilder
from router.parsers.scanner import Markers, MarkerScanner


class MarkupParser:
    """Base of the GLM and DeepSeek parsers; implements `OutputParser`."""

    __slots__ = ("_out", "_scan")

    def __init__(self, out: MessageBuilder) -> None:
        self._out = out
        self._scan = MarkerScanner()

    def feed(self, text: str) -> ParsedDelta:
        """Consume the next text delta; return what is now decided."""
        scan = self._scan
        scan.push(text)
        while True:
            markers = self._markers()
            plain, marker = scan.next(markers)
            if plain:
                self._on_text(plain)
                if marker is not None and self._markers() is not markers:
                    # The text changed the state: the marker may mean nothing now.
                    scan.unread(marker)
                    continue
            if marker is None:
                return self._out.take()
            self._on_marker(marker)

    def finish(self) -> ParsedDelta:
        """End of output: held text is what it is, a cut-off call keeps complete arguments."""
        rest = self._scan.drain()
        if rest:
            self._on_text(rest)
        self._on_end()
        self._out.finish()
        return self._out.take()

    def message(self) -> ParsedMessage:
        """The message decided so far (final after `finish`)."""
        return self._out.message()

    def _markers(self) -> Markers:
        """The markers that mean something in the current state."""
        raise NotImplementedError

    def _on_text(self, text: str) -> None:
        """Plain text (no marker of the current state in it)."""
        raise NotImplementedError

    def _on_marker(self, marker: str) -> None:
        """A marker of the current state."""
        raise NotImplementedError

    def _on_end(self) -> None:
        """End of output, after held text went through `_on_text`."""
