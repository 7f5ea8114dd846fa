"""Whole SSE events out of an upstream's stream, whose bytes arrive in arbitrary chunks, for
what judges an event whole (the throughput path's usage filters, `throughput/usage.py` and
`stream_usage.py`; the latency path's `native_decode.py`).

An event is held until its end arrives, up to `max_pending` bytes; one growing past that is
handed on untouched as it comes (the client loses no byte of it, only the filter's look at
it), and whole events resume after its end. Each chunk costs work in its own size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.upstream.tilert import MAX_LINE_BYTES

EVENT_END = b"\n\n"
MAX_PENDING_EVENT_BYTES = MAX_LINE_BYTES
"""An event held until its end arrives, at most; the bound a node's stream puts on a line."""

Piece = tuple[bool, bytes]
"""(whole, data): `data` is whole events, each ending with EVENT_END, if `whole`; else bytes
of an event too large to hold, handed on as they came."""


@dataclass(slots=True)
class EventCutter:
    max_pending: int = MAX_PENDING_EVENT_BYTES
    _pending: list[bytes] = field(default_factory=list)  # an event whose end has not come
    _pending_bytes: int = 0
    _passing: bool = False  # inside an event over `max_pending`: handed on until its end
    _passed_newline: bool = False  # the last byte handed on ended a line

    @property
    def idle(self) -> bool:
        """Nothing held and no oversized event under way: the next chunk starts an event."""
        return not self._pending and not self._passing

    def feed(self, chunk: bytes) -> list[Piece]:
        pieces: list[Piece] = []
        while chunk:
            if self._passing:
                end = _after_first_end(chunk, self._passed_newline)
                if end < 0:
                    self._passed_newline = chunk.endswith(b"\n")
                    pieces.append((False, chunk))
                    return pieces
                self._passing = False
                pieces.append((False, chunk[:end]))
                chunk = chunk[end:]
                continue
            after_newline = self._pending[-1].endswith(b"\n") if self._pending else False
            cut = _after_last_end(chunk, after_newline)
            if cut < 0:
                self._pending.append(chunk)
                self._pending_bytes += len(chunk)
                if self._pending_bytes > self.max_pending:
                    held = self.flush()
                    self._passing, self._passed_newline = True, held.endswith(b"\n")
                    pieces.append((False, held))
                return pieces
            pieces.append((True, b"".join((*self._pending, chunk[:cut]))))
            rest = chunk[cut:]
            self._pending, self._pending_bytes = ([rest], len(rest)) if rest else ([], 0)
            return pieces
        return pieces

    def flush(self) -> bytes:
        """What is held (an event whose end never came), handed back once."""
        held = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return held


def _after_last_end(chunk: bytes, after_newline: bool) -> int:
    """Where the last event end in `chunk` ends (`after_newline`: the bytes before it ended
    a line, so a leading newline ends an event); -1 if none."""
    cut = chunk.rfind(EVENT_END)
    if cut >= 0:
        return cut + len(EVENT_END)
    return 1 if after_newline and chunk.startswith(b"\n") else -1


def _after_first_end(chunk: bytes, after_newline: bool) -> int:
    """Where the first event end in `chunk` ends, as `_after_last_end` finds the last."""
    if after_newline and chunk.startswith(b"\n"):
        return 1
    cut = chunk.find(EVENT_END)
    return cut + len(EVENT_END) if cut >= 0 else -1
