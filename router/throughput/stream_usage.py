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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from router.serving import RoutedRequest

if TYPE_CHECKING:
    from router.throughput.answer import ChunkFilter

_EVENT_END = b"\n\n"
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
    and gives its `system_fingerprint` back to the finishing chunk before it. An event
    split over chunks is held until its end, to be judged whole; the finishing chunk
    until the next event says whether a usage chunk follows."""

    inner: ChunkFilter | None = None
    _pending: bytes = b""
    _finishing: bytes | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self.inner is not None:
            chunk = self.inner.feed(chunk)
        data = self._pending + chunk if self._pending else chunk
        cut = data.rfind(_EVENT_END)
        if cut < 0:
            self._pending = data
            return b""
        cut += len(_EVENT_END)
        complete, self._pending = data[:cut], data[cut:]
        if self._finishing is None and _FINISH_MARK not in complete and _USAGE_MARK not in complete:
            return complete
        return b"".join(self._events(complete.split(_EVENT_END)[:-1]))

    def flush(self) -> bytes:
        tail = self.inner.flush() if self.inner is not None else b""
        data, self._pending = self._pending + tail, b""
        *events, rest = data.split(_EVENT_END)
        out = b"".join(self._events(events))
        if self._finishing is not None:
            out, self._finishing = out + self._finishing + _EVENT_END, None
        return out + rest

    def _events(self, events: list[bytes]) -> Iterator[bytes]:
        for event in events:
            payload: Any = None
            if _FINISH_MARK in event or _USAGE_MARK in event:
                payload = _payload(event)
            if self._finishing is not None:
                finishing, self._finishing = self._finishing, None
                if _usage_only(payload):
                    yield _with_fingerprint(finishing, payload) + _EVENT_END
                    continue
                yield finishing + _EVENT_END
            if _usage_only(payload):
                continue
            if _finishing(payload):
                self._finishing = event
                continue
            yield event + _EVENT_END


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
