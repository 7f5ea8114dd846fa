"""An upstream's reply as the client's answer on the throughput path.

A body that is not an event stream is read whole before anything is sent to the client,
so its failures still get a proper status; an event stream is relayed chunk by chunk as it
arrives, and a failure mid-way (or a stream ended without its last event) goes on on
another server (`continuation`) where it can, else becomes an SSE error event on an event
boundary.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol

from router.errors import GatewayError, UpstreamError
from router.openai.sse import EVENT_END
from router.serving import Answer, RoutedRequest, whole_answer
from router.telemetry import tracing
from router.telemetry.metrics import Metrics
from router.throughput.meter import AnswerMeter
from router.throughput.stream_usage import UsageChunkDropper, asks_for_usage
from router.upstream import Reply

if TYPE_CHECKING:
    from router.throughput.continuation import Continuation

log = logging.getLogger("pd_gateway.throughput")


class ChunkFilter(Protocol):
    """Rewrites an event stream on its way through; most chunks come back unchanged."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


async def read_unless_streamed(reply: Reply) -> Reply:
    """Read a reply's whole body now unless it is an event stream."""
    if not reply.is_event_stream():
        await reply.read()
    return reply


def forward(
    reply: Reply,
    request: RoutedRequest,
    metrics: Metrics | None,
    *,
    rewrite: ChunkFilter | None = None,
    body: bytes | None = None,
    go_on: Continuation | None = None,
) -> Answer:
    """The client's view of `reply`: its status and end-to-end headers, then its body,
    measured on the way (`AnswerMeter`).

    A body read whole is sent as `body` if given (a rewritten copy), else as it came; an
    event stream goes through `rewrite` chunk by chunk, then loses the usage chunk the
    gateway asked for (`stream_usage`); if the upstream fails mid-way, it goes on as
    `go_on` continues it, or ends with the endpoint's `stream_failure` event.
    """
    headers = reply.forwarded_headers()
    meter = AnswerMeter(request, metrics)
    if go_on is not None:
        rewrite = Chained(go_on.track, rewrite)
    if asks_for_usage(request):
        rewrite = UsageChunkDropper(rewrite)
    if reply.content is not None:
        content = reply.content if body is None else body
        meter.body(content)
        return whole_answer(reply.status, headers, content)
    return Answer(reply.status, headers, _stream(reply, request, meter, rewrite, go_on))


async def _stream(
    reply: Reply,
    request: RoutedRequest,
    meter: AnswerMeter,
    rewrite: ChunkFilter | None,
    go_on: Continuation | None,
) -> AsyncGenerator[bytes, None]:
    # After the first byte the status is spent: a failure becomes an SSE error event.
    try:
        last = EVENT_END
        failure: GatewayError
        try:
            async for raw in reply.chunks(by_lines=True):
                meter.chunk(raw)
                chunk = raw if rewrite is None else rewrite.feed(raw)
                if chunk:
                    last = chunk
                    yield chunk
            if rewrite is not None and (tail := rewrite.flush()):
                yield tail
            if go_on is None or go_on.track.done or go_on.track.finished:
                return
            failure = reply.target.failure(
                "broken", "ended its stream without its last event", status=502
            )
            reason = "decode_truncated"
        except UpstreamError as exc:
            failure, reason = (
                exc,
                "decode_stalled" if "timeout" in str(exc.code) else "decode_failed",
            )
        if go_on is not None and go_on.can_go_on():
            try:
                async for chunk in go_on.rest(reason):
                    meter.chunk(chunk)
                    last = chunk
                    yield chunk
                return
            except GatewayError as exc:
                failure = exc
        log.warning("%s (mid-stream): %s", reply.target.label, failure.message)
        error = reply.target.failure("failed", f"failed mid-stream: {failure.message}", status=502)
        request.access.ended_with(error)
        tracing.failed(error)
        gap = b"" if last.endswith(EVENT_END) else b"\n" if last.endswith(b"\n") else EVENT_END
        yield gap + request.endpoint.stream_failure(error)
    finally:
        meter.close()


class Chained:
    """Two filters, one after the other."""

    def __init__(self, first: ChunkFilter, then: ChunkFilter | None) -> None:
        self._first, self._then = first, then

    def feed(self, chunk: bytes) -> bytes:
        out = self._first.feed(chunk)
        return self._then.feed(out) if self._then is not None and out else out

    def flush(self) -> bytes:
        out = self._first.flush()
        if self._then is None:
            return out
        return (self._then.feed(out) if out else b"") + self._then.flush()
