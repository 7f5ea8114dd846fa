"""The httpx boundary of the throughput path: send a leg, read its answer, translate failures.

Every httpx exception is turned into a `router.errors.UpstreamError` here (502 unreachable,
504 timed out, naming the leg), so nothing above this module sees one. A body that is not an
event stream is read whole before anything is sent to the client, so its failures still get
a proper status; an event stream is relayed chunk by chunk as it arrives.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from router.config import TimeoutsConfig
from router.errors import UpstreamError, sse_error_event, upstream_message

log = logging.getLogger("pd_gateway.throughput")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Besides hop-by-hop headers: the gateway's server frames the body itself and adds its own
# date and server; bodies are relayed decoded, so no content-encoding either.
NOT_FORWARDED = HOP_BY_HOP | {"content-length", "content-encoding", "date", "server"}


@dataclass(frozen=True, slots=True)
class Leg:
    """One upstream request: who it goes to and how its failures are named."""

    name: str
    url: str
    path: str
    request_id: str
    timeout: httpx.Timeout
    error: type[UpstreamError] = UpstreamError

    def failure(self, message: str, *, status: int, code: str) -> UpstreamError:
        return self.error(f"the {self.name} leg {message}", status=status, code=code)


def leg_timeout(timeouts: TimeoutsConfig, *, read_s: float | None) -> httpx.Timeout:
    """Connect bounded by `connect_s`; `read_s` bounds each wait for bytes (None: unbounded)."""
    return httpx.Timeout(
        connect=timeouts.connect_s, read=read_s, write=timeouts.prefill_s, pool=timeouts.connect_s
    )


@dataclass(slots=True)
class Reply:
    """An upstream answer whose headers have arrived.

    `content` is the whole body when the answer is not an event stream; an event stream's
    body is still to be read from `response`.
    """

    leg: Leg
    response: httpx.Response
    content: bytes | None

    @property
    def status(self) -> int:
        return self.response.status_code


class ChunkFilter(Protocol):
    """Rewrites an event stream on its way through; most chunks come back unchanged."""

    def feed(self, chunk: bytes) -> bytes: ...

    def flush(self) -> bytes: ...


@dataclass(slots=True)
class Upstream:
    """What the client is sent: status, headers and the body's chunks."""

    status: int
    headers: list[tuple[bytes, bytes]]
    chunks: AsyncGenerator[bytes, None]


async def send_leg(
    http: httpx.AsyncClient, leg: Leg, body: dict[str, Any], stack: AsyncExitStack
) -> Reply:
    """POST `body` to the leg; the open response is closed when `stack` unwinds."""
    request = http.build_request(
        "POST",
        leg.url + leg.path,
        content=orjson.dumps(body),
        headers={
            "content-type": "application/json",
            "accept-encoding": "identity",
            "x-request-id": leg.request_id,
        },
        timeout=leg.timeout,
    )
    try:
        response = await http.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise _transport_failure(leg, exc) from None
    stack.push_async_callback(response.aclose)
    if is_event_stream(response.headers):
        return Reply(leg, response, None)
    return Reply(leg, response, await _read_all(leg, response))


def is_event_stream(headers: Mapping[str, str]) -> bool:
    return headers.get("content-type", "").startswith("text/event-stream")


def status_failure(reply: Reply) -> UpstreamError:
    """The error for a leg that answered with an error status, before anything was relayed."""
    status = reply.status
    # 4xx is the client's own request refused, 503/504 keep their meaning (overloaded, timed
    # out); any other failure of an upstream is a bad gateway.
    mapped = status if 400 <= status < 500 or status in (503, 504) else 502
    detail = upstream_message(reply.content or b"")
    return reply.leg.failure(
        f"answered {status}: {detail}", status=mapped, code=f"{reply.leg.name}_failed"
    )


def forwarded_headers(headers: httpx.Headers) -> list[tuple[bytes, bytes]]:
    """End-to-end headers only: hop-by-hop ones, and any the Connection header names, go."""
    dropped = NOT_FORWARDED | {
        token.strip().lower() for token in headers.get("connection", "").split(",")
    }
    kept = []
    for name, value in headers.raw:
        lower = name.lower()
        if lower.decode("latin-1") not in dropped:
            kept.append((lower, value))
    return kept


def relay(
    reply: Reply, *, rewrite: ChunkFilter | None = None, body: bytes | None = None
) -> Upstream:
    """The client's view of `reply`: its status and end-to-end headers, then its body.

    A buffered body is sent as `body` if given (a rewritten copy), else as it came; an event
    stream goes through `rewrite` chunk by chunk.
    """
    headers = forwarded_headers(reply.response.headers)
    if reply.content is not None:
        return Upstream(reply.status, headers, once(reply.content if body is None else body))
    return Upstream(reply.status, headers, _stream(reply, rewrite))


async def once(content: bytes) -> AsyncGenerator[bytes, None]:
    yield content


async def _read_all(leg: Leg, response: httpx.Response) -> bytes:
    try:
        return await response.aread()
    except httpx.HTTPError as exc:
        raise _transport_failure(leg, exc) from None


async def _stream(reply: Reply, rewrite: ChunkFilter | None) -> AsyncGenerator[bytes, None]:
    # After the first byte the status is spent: a failure becomes an SSE error event, placed
    # on an event boundary, and the stream ends cleanly.
    last = b"\n\n"
    try:
        async for raw in reply.response.aiter_bytes():
            chunk = raw if rewrite is None else rewrite.feed(raw)
            if chunk:
                last = chunk
                yield chunk
        if rewrite is not None and (tail := rewrite.flush()):
            yield tail
    except httpx.HTTPError as exc:
        leg = reply.leg
        log.warning(
            "%s leg %s failed mid-stream (request %s): %r", leg.name, leg.url, leg.request_id, exc
        )
        error = leg.failure(
            f"failed mid-stream: {type(exc).__name__}", status=502, code=f"{leg.name}_failed"
        )
        gap = b"" if last.endswith(b"\n\n") else b"\n" if last.endswith(b"\n") else b"\n\n"
        yield gap + sse_error_event(error)


def _transport_failure(leg: Leg, exc: httpx.HTTPError) -> UpstreamError:
    log.warning("%s leg %s failed (request %s): %r", leg.name, leg.url, leg.request_id, exc)
    if isinstance(exc, httpx.TimeoutException):
        return leg.failure("timed out", status=504, code=f"{leg.name}_timeout")
    return leg.failure(
        f"is unreachable: {type(exc).__name__}", status=502, code=f"{leg.name}_unreachable"
    )
