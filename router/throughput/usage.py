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

from router.upstream.sse_events import EVENT_END, MAX_PENDING_EVENT_BYTES, EventCutter

_MARK = b'"cached_tokens"'
_DATA = b"data: "


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
    Events are judged whole (`EventCutter`): one too large to hold goes on unrewritten.
    """

    prefill_cached: int
    max_pending: int = MAX_PENDING_EVENT_BYTES
    _events: EventCutter = field(init=False)

    def __post_init__(self) -> None:
        self._events = EventCutter(self.max_pending)

    def body(self, content: bytes) -> bytes:
        if _MARK not in content:
            return content
        try:
            payload = orjson.loads(content)
        except orjson.JSONDecodeError:
            return content
        return orjson.dumps(payload) if rewrite_usage(payload, self.prefill_cached) else content

    def feed(self, chunk: bytes) -> bytes:
        # Fast path: a chunk of whole events without usage details goes through untouched.
        if self._events.idle and chunk.endswith(EVENT_END) and _MARK not in chunk:
            return chunk
        return b"".join(
            self._rewritten(data) if whole else data for whole, data in self._events.feed(chunk)
        )

    def flush(self) -> bytes:
        rest = self._events.flush()
        return self._event(rest) if _MARK in rest else rest

    def _rewritten(self, events: bytes) -> bytes:
        if _MARK not in events:
            return events
        return EVENT_END.join(self._event(e) for e in events.split(EVENT_END))

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
