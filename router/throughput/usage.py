"""Report the prefill's cache hits in `usage.prompt_tokens_details.cached_tokens`.

The decode instance of a disaggregated pair received the whole prompt's KV state from the
prefill instance and so reports every prompt token as cached; the client should see what
the prefill instance actually found in its prefix cache. Only answers that carry
`cached_tokens` are parsed at all; in a stream, that is the usage-bearing event(s) alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from router.upstream.tilert import MAX_LINE_BYTES

_MARK = b'"cached_tokens"'
_EVENT_END = b"\n\n"
_DATA = b"data: "
MAX_PENDING_EVENT_BYTES = MAX_LINE_BYTES
"""An event held until its end arrives, at most; the bound a node's stream puts on a line."""


def rewrite_usage(payload: Any, prefill_cached: int) -> bool:
    """Fix `payload`'s usage in place if it reports the whole prompt cached; True if changed."""
    if not isinstance(payload, dict):
        return False
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return False
    details = usage.get("prompt_tokens_details")
    prompt = usage.get("prompt_tokens")
    if not isinstance(details, dict) or not isinstance(prompt, int):
        return False
    cached = details.get("cached_tokens")
    if not isinstance(cached, int) or cached < prompt or cached == prefill_cached:
        return False
    details["cached_tokens"] = prefill_cached
    return True


@dataclass(slots=True)
class CachedTokensRewriter:
    """Applies `rewrite_usage` to a whole JSON body or to an SSE stream chunk by chunk.

    `prefill_cached` is the prefill leg's own `cached_tokens` (0 when it reported none).
    An event is held until its end arrives, up to `max_pending` bytes; one growing past
    that is passed on untouched as it comes (the client loses no byte of it, only its
    rewrite), and rewriting goes on after its end. Each chunk costs work in its own size.
    """

    prefill_cached: int
    max_pending: int = MAX_PENDING_EVENT_BYTES
    _pending: list[bytes] = field(default_factory=list)  # an event whose end has not come
    _pending_bytes: int = 0
    _passing: bool = False  # inside an event over `max_pending`: passed on until its end
    _passed_newline: bool = False  # the last byte passed on was a line's end

    def body(self, content: bytes) -> bytes:
        if _MARK not in content:
            return content
        try:
            payload = orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
        return orjson.dumps(payload) if rewrite_usage(payload, self.prefill_cached) else content

    def feed(self, chunk: bytes) -> bytes:
        if self._passing:
            return self._pass(chunk)
        # Fast path: a chunk of whole events without usage details goes through untouched.
        if not self._pending and chunk.endswith(_EVENT_END) and _MARK not in chunk:
            return chunk
        cut = _after_last_end(chunk, self._pending[-1].endswith(b"\n") if self._pending else False)
        if cut < 0:
            if chunk:
                self._pending.append(chunk)
                self._pending_bytes += len(chunk)
            if self._pending_bytes <= self.max_pending:
                return b""
            held = self._take_pending()
            self._passing, self._passed_newline = True, held.endswith(b"\n")
            return held
        complete = b"".join((*self._pending, chunk[:cut]))
        rest = chunk[cut:]
        self._pending, self._pending_bytes = ([rest], len(rest)) if rest else ([], 0)
        if _MARK not in complete:
            return complete
        return _EVENT_END.join(self._event(e) for e in complete.split(_EVENT_END))

    def flush(self) -> bytes:
        rest = self._take_pending()
        return self._event(rest) if _MARK in rest else rest

    def _pass(self, chunk: bytes) -> bytes:
        """The oversized event's bytes as they come; what follows its end, as usual."""
        end = _after_first_end(chunk, self._passed_newline)
        if end < 0:
            if chunk:
                self._passed_newline = chunk.endswith(b"\n")
            return chunk
        self._passing = False
        return chunk[:end] + self.feed(chunk[end:])

    def _take_pending(self) -> bytes:
        held = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        return held

    def _event(self, event: bytes) -> bytes:
        if _MARK not in event or not event.startswith(_DATA):
            return event
        try:
            payload = orjson.loads(event[len(_DATA) :])
        except orjson.JSONDecodeError:
            return event
        if not rewrite_usage(payload, self.prefill_cached):
            return event
        return _DATA + orjson.dumps(payload)


def _after_last_end(chunk: bytes, after_newline: bool) -> int:
    """Where the last event end in `chunk` ends (`after_newline`: the bytes before it ended
    a line, so a leading newline ends an event); -1 if none."""
    cut = chunk.rfind(_EVENT_END)
    if cut >= 0:
        return cut + len(_EVENT_END)
    return 1 if after_newline and chunk.startswith(b"\n") else -1


def _after_first_end(chunk: bytes, after_newline: bool) -> int:
    """Where the first event end in `chunk` ends, as `_after_last_end` finds the last."""
    if after_newline and chunk.startswith(b"\n"):
        return 1
    cut = chunk.find(_EVENT_END)
    return cut + len(_EVENT_END) if cut >= 0 else -1
