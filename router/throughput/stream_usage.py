"""Token counts for every chat and completions stream on the native path.

vLLM ends such a stream with its usage (a chunk of `choices: []` and `usage`) only when
asked, `stream_options.include_usage`. When the client did not ask, the gateway asks for
it, reads it (`AnswerMeter`) and takes that chunk out of what the client is sent, so the
client gets the stream it asked for. Asked, vLLM moves `system_fingerprint` from the
finishing chunk to the usage chunk: it is put back where the client's stream has it.

Not asked for: a client asking for `continuous_usage_stats` alone (vLLM would then put
usage on every chunk), and `n` > 1 (the finishing chunks are not the last before the
usage chunk: one choice's finish is followed by another's text).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from router.serving import RoutedRequest
from router.upstream.sse_events import EVENT_END, MAX_PENDING_EVENT_BYTES, EventCutter

if TYPE_CHECKING:
    from router.throughput.answer import ChunkFilter

_DATA = b"data: "
_USAGE_MARK = b'"usage"'
_FINISH_MARK = b'"finish_reason":"'


def asks_for_usage(request: RoutedRequest) -> bool:
    """Whether the gateway adds `include_usage` to what it sends for `request`."""
    if request.endpoint.name not in ("chat", "completions"):
        return False
    options = request.body.get("stream_options")
    options = options if isinstance(options, dict) else {}
    asked = options.get("include_usage") or options.get("continuous_usage_stats")
    return bool(request.parsed.stream) and not asked and request.parsed.n == 1


def with_usage(body: dict[str, Any]) -> dict[str, Any]:
    """`body` asking for its stream's usage (a copy; the client's stays as it came)."""
    options = body.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    return {**body, "stream_options": options}


@dataclass(slots=True)
class UsageChunkDropper:
    """Drops the usage-only chunk from a stream, after `inner` (another filter) if any,
    and gives its `system_fingerprint` back to the finishing chunk before it. Events are
    judged whole (`EventCutter`; one too large to hold is no usage chunk, and goes on as
    it comes); the finishing chunk is held until the next event says whether a usage
    chunk follows."""

    inner: ChunkFilter | None = None
    max_pending: int = MAX_PENDING_EVENT_BYTES
    _events: EventCutter = field(init=False)
    _finishing: bytes | None = None

    def __post_init__(self) -> None:
        self._events = EventCutter(self.max_pending)

    def feed(self, chunk: bytes) -> bytes:
        if self.inner is not None:
            chunk = self.inner.feed(chunk)
        return self._filtered(chunk)

    def flush(self) -> bytes:
        out = self._filtered(self.inner.flush()) if self.inner is not None else b""
        return out + self._finished() + self._events.flush()

    def _filtered(self, chunk: bytes) -> bytes:
        if (
            self._finishing is None
            and self._events.idle
            and chunk.endswith(EVENT_END)
            and _FINISH_MARK not in chunk
            and _USAGE_MARK not in chunk
        ):
            return chunk  # whole events, none of them the finish or the usage: most chunks
        out: list[bytes] = []
        for whole, data in self._events.feed(chunk):
            if not whole:
                out += (self._finished(), data)
            elif self._finishing is None and _FINISH_MARK not in data and _USAGE_MARK not in data:
                out.append(data)
            else:
                out += self._judged(data.split(EVENT_END)[:-1])
        return b"".join(out)

    def _finished(self) -> bytes:
        """The finishing chunk held, now that no usage chunk follows it."""
        finishing, self._finishing = self._finishing, None
        return b"" if finishing is None else finishing + EVENT_END

    def _judged(self, events: list[bytes]) -> Iterator[bytes]:
        for event in events:
            payload: Any = None
            if _FINISH_MARK in event or _USAGE_MARK in event:
                payload = _payload(event)
            if self._finishing is not None:
                if _usage_only(payload):
                    finishing, self._finishing = self._finishing, None
                    yield _with_fingerprint(finishing, payload) + EVENT_END
                    continue
                yield self._finished()
            if _usage_only(payload):
                continue
            if _finishing(payload):
                self._finishing = event
                continue
            yield event + EVENT_END


def _payload(event: bytes) -> Any:
    if not event.startswith(_DATA):
        return None
    try:
        return orjson.loads(event[len(_DATA) :])
    except orjson.JSONDecodeError:
        return None


def _usage_only(payload: Any) -> bool:
    return (
        isinstance(payload, dict)
        and payload.get("choices") == []
        and isinstance(payload.get("usage"), dict)
    )


def _finishing(payload: Any) -> bool:
    if not isinstance(payload, dict) or "system_fingerprint" in payload:
        return False
    choices = payload.get("choices")
    return (
        isinstance(choices, list)
        and len(choices) == 1
        and isinstance(choices[0], dict)
        and choices[0].get("finish_reason") is not None
    )


def _with_fingerprint(event: bytes, usage_chunk: dict[str, Any]) -> bytes:
    """`event` (a chunk's JSON object) with the fingerprint as its last field, where vLLM
    puts it on a finishing chunk."""
    fingerprint = usage_chunk.get("system_fingerprint")
    if fingerprint is None or not event.endswith(b"}"):
        return event
    return event[:-1] + b',"system_fingerprint":' + orjson.dumps(fingerprint) + b"}"
