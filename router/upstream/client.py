"""The one way the gateway calls a backend: `Upstreams` keeps one connection pool per
upstream base URL, held to `upstreams` in router.yaml, with timeouts from `timeouts` only.

A call names its `Target` (for errors), how long each wait for the answer's bytes may
last and, unless the answer is a stream, how long the whole answer may take; its answer is
a `Reply`, whose body is read whole, line by line or chunk by chunk.
Every transport failure, at any of those steps, surfaces as a `router.errors.UpstreamError`.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any

import orjson

from router import __version__
from router.config import UpstreamsConfig
from router.errors import UpstreamError
from router.upstream.failures import Target, status_failure, transport_failure
from router.upstream.http1 import Http1Transport
from router.upstream.timeouts import Timeouts
from router.upstream.trace_context import add_trace_context
from router.upstream.transport import (
    BaseURL,
    Broken,
    Limits,
    Pool,
    RawHeaders,
    RawReply,
    TimedOut,
    Transport,
    TransportFailure,
    Waits,
)

log = logging.getLogger("pd_gateway.upstream")

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

# Every request's headers: bodies are asked for as they are, to be relayed as they come.
_REQUEST_HEADERS = (
    (b"accept", b"*/*"),
    (b"accept-encoding", b"identity"),
    (b"connection", b"keep-alive"),
    (b"user-agent", f"pd-gateway/{__version__}".encode("ascii")),
)


def limits_of(config: UpstreamsConfig) -> Limits:
    """What every pool holds to, from router.yaml's `upstreams`."""
    return Limits(
        max_connections=config.max_connections,
        max_idle_connections=config.max_keepalive_connections,
        idle_expiry_s=config.keepalive_expiry_s,
        max_header_bytes=config.max_header_bytes,
        max_header_count=config.max_header_count,
        max_body_bytes=config.max_body_bytes,
    )


class Reply:
    """An upstream's answer whose status and headers have arrived; its body is read through
    the methods below, which translate failures. Close it (`aclose`) on every path."""

    __slots__ = (
        "_answer",
        "_deadline",
        "_max_body_bytes",
        "_raw_headers",
        "_read_s",
        "_source",
        "_total_s",
        "content",
        "status",
        "target",
    )

    def __init__(
        self,
        target: Target,
        answer: RawReply,
        *,
        read_s: float | None,
        max_body_bytes: int,
        total_s: float | None = None,
        deadline: float | None = None,
    ) -> None:
        """`deadline`: the event loop's time by which the whole answer must have arrived
        (`total_s` after it was asked for), if it must."""
        self.target = target
        self.status = answer.status
        self._raw_headers = answer.headers
        self._answer = answer
        self._read_s = read_s
        self._max_body_bytes = max_body_bytes
        self._total_s = total_s
        self._deadline = deadline
        self._source: RawReply | _Decoded | None = None  # what `receive` reads
        self.content: bytes | None = None
        """The whole body, once `read()` has run."""

    def is_event_stream(self) -> bool:
        content_type = self._header(b"content-type") or b""
        return content_type.startswith(b"text/event-stream")

    def forwarded_headers(self) -> RawHeaders:
        """End-to-end headers only: hop-by-hop ones, and any the Connection header names, go."""
        named = (self._header(b"connection") or b"").decode("latin-1")
        dropped = NOT_FORWARDED | {token.strip().lower() for token in named.split(",")}
        return [
            (name.lower(), value)
            for name, value in self._raw_headers
            if name.lower().decode("latin-1") not in dropped
        ]

    async def read(self) -> bytes:
        """The whole body, at most `max_body_bytes` of it (decoded): a longer one is a
        broken answer, and its connection is closed."""
        if self.content is None:
            cap = self._max_body_bytes
            parts, size = [], 0
            async for chunk in self.chunks():
                size += len(chunk)
                if size > cap:
                    await self._answer.aclose()
                    raise self._too_long()
                parts.append(chunk)
            self.content = b"".join(parts)
        return self.content

    def _too_long(self) -> UpstreamError:
        cap = Broken(f"sent a body over max_body_bytes ({self._max_body_bytes} bytes)")
        return transport_failure(self.target, cap)

    async def json(self) -> Any:
        """The body parsed as JSON; None if it is not JSON."""
        try:
            return orjson.loads(await self.read())
        except orjson.JSONDecodeError:
            return None

    async def failure(self) -> UpstreamError:
        """The error for this answer's error status, naming the upstream's own message."""
        try:
            content = await self.read()
        except UpstreamError:
            content = b""
        return status_failure(self.target, self.status, content)

    async def chunks(self, *, by_lines: bool = False) -> AsyncIterator[bytes]:
        """The body as it arrives, each wait bounded by the call's `read_s`. `by_lines`, for
        a stream of lines or events that has no whole-answer deadline: `read_s` bounds the
        time from one line's end to the next's instead, so a stream is never cut while its
        lines keep coming, and one trickling in without ending a line ends all the same."""
        read_s = self._read_s
        gap_s = read_s if by_lines else None
        loop = asyncio.get_running_loop()
        line_due = None if gap_s is None else loop.time() + gap_s
        while True:
            wait_s = read_s if line_due is None else max(line_due - loop.time(), 0.0)
            try:
                chunk = await self.receive(wait_s)
            except TimeoutError:
                progress = "no line's end" if line_due is not None else "no body bytes"
                stalled = TimedOut(f"{progress} within {read_s} s")
                raise transport_failure(self.target, stalled) from None
            if not chunk:
                return
            if gap_s is not None and b"\n" in chunk:
                line_due = loop.time() + gap_s
            yield chunk

    async def receive(self, timeout_s: float | None) -> bytes:
        """The body's next bytes, as many as have arrived; b"" once it has ended. Raises
        TimeoutError if none arrive within `timeout_s`; a timeout or a cancelled caller loses
        nothing, the next call goes on from there."""
        source = self._source
        if source is None:
            coding = self._header(b"content-encoding")
            if coding is None or coding.strip().lower() == b"identity":
                source = self._source = self._answer
            else:  # asked for none, but a server may encode all the same
                source = self._source = _Decoded(self._answer, coding.strip().lower())
        deadline = self._deadline
        if deadline is not None:
            left = deadline - asyncio.get_running_loop().time()
            if timeout_s is None or left < timeout_s:
                # What has arrived is handed out even past the deadline; a wait is not.
                try:
                    return await self._received(source, max(left, 0.0))
                except TimeoutError:
                    overdue = TimedOut(f"no whole answer within {self._total_s:g} s")
                    raise transport_failure(self.target, overdue) from None
        return await self._received(source, timeout_s)

    async def _received(self, source: RawReply | _Decoded, timeout_s: float | None) -> bytes:
        try:
            return await source.receive(timeout_s)
        except TransportFailure as exc:
            raise transport_failure(self.target, exc) from None

    async def aclose(self) -> None:
        await self._answer.aclose()

    def _header(self, name: bytes) -> bytes | None:
        for key, value in self._raw_headers:
            if key.lower() == name:
                return value
        return None


# How much a decoder hands out at once: a small body cannot expand into a large buffer.
_DECODED_PIECE = 256 * 1024
# gzip's wrapping, or zlib's (what HTTP calls deflate).
_ZLIB_WINDOW = {
    b"gzip": 16 + zlib.MAX_WBITS,
    b"x-gzip": 16 + zlib.MAX_WBITS,
    b"deflate": zlib.MAX_WBITS,
}


class _Decoded:
    """A gzip or deflate body, decoded as it is received."""

    def __init__(self, answer: RawReply, coding: bytes) -> None:
        self._answer = answer
        self._coding = coding.decode("latin-1")
        window = _ZLIB_WINDOW.get(coding)
        self._zlib = None if window is None else zlib.decompressobj(window)
        self._ended = False

    async def receive(self, timeout_s: float | None) -> bytes:
        decoder = self._zlib
        if decoder is None:
            raise Broken(f"sent a body encoded as {self._coding!r}, which is not decoded")
        while not self._ended:
            data = decoder.unconsumed_tail
            if not data:
                data = await self._answer.receive(timeout_s)
                if not data:
                    self._ended = True
                    return decoder.flush()
            try:
                out = decoder.decompress(data, _DECODED_PIECE)
            except zlib.error as exc:
                raise Broken(f"sent a body that is not valid {self._coding}: {exc}") from None
            if out:
                return out
        return b""


class Upstreams:
    """Pooled connections, one pool per upstream base URL, made on first use and closed
    together.

    `transport` makes the pools: the gateway's own (`Http1Transport`) unless another is
    given (`HttpxTransport`: httpx's pool, or a script of the upstreams in tests)."""

    def __init__(
        self,
        pools: UpstreamsConfig,
        timeouts: Timeouts,
        *,
        credentials: Mapping[str, str] | None = None,
        transport: Transport | None = None,
    ) -> None:
        """`credentials`: base URL -> the API key that backend expects."""
        self.timeouts = timeouts
        self.limits = limits_of(pools)
        self._transport = transport or Http1Transport()
        self._authorization = {base: f"Bearer {key}" for base, key in (credentials or {}).items()}
        self._pools: dict[str, Pool] = {}
        self._closed = False

    def _pool(self, base: str) -> Pool:
        pool = self._pools.get(base)
        if pool is None:
            headers = list(_REQUEST_HEADERS)
            if (authorization := self._authorization.get(base)) is not None:
                headers.append((b"authorization", authorization.encode("latin-1")))
            pool = self._pools[base] = self._transport.pool(BaseURL(base, headers), self.limits)
        return pool

    async def open(
        self,
        target: Target,
        method: str,
        base: str,
        path: str,
        *,
        body: Any = None,
        read_s: float | None,
        total_s: float | None = None,
        request_id: str | None = None,
        stack: AsyncExitStack | None = None,
    ) -> Reply:
        """Send a request; return once its status and headers have arrived. The reply is
        closed when `stack` unwinds, if one is given; otherwise by the caller.

        `read_s` bounds the wait for the whole head, then each wait for body bytes (or, for
        a body read `by_lines`, for each line's end); `total_s` the whole answer, head and
        body, from now: every answer that is not a stream has one."""
        if self._closed:
            raise target.failure("unreachable", "is not called: the gateway is closing", status=502)
        content = None if body is None else orjson.dumps(body)
        headers: RawHeaders = []
        if request_id is not None:
            headers.append((b"x-request-id", request_id.encode("latin-1")))
        if content is not None:
            headers.append((b"content-type", b"application/json"))
        add_trace_context(headers)
        t = self.timeouts
        write_s = t.prefill_s if read_s is None else read_s
        deadline = None if total_s is None else asyncio.get_running_loop().time() + total_s
        waits = Waits(
            pool_s=t.connect_s,
            connect_s=t.connect_s,
            write_s=write_s,
            read_s=read_s,
            deadline=deadline,
        )
        try:
            answer = await self._pool(base).send(method, path, headers, content, waits)
        except TransportFailure as exc:
            # Request legs are worth a line each; probes and cleanups fail quietly.
            level = logging.WARNING if request_id is not None else logging.DEBUG
            log.log(level, "%s %s%s failed (request %s): %r", method, base, path, request_id, exc)
            raise transport_failure(target, exc) from None
        # The answer does not keep its request: a stream may stay open for minutes, and the
        # request's body (a whole prompt) is not needed once sent.
        reply = Reply(
            target,
            answer,
            read_s=read_s,
            max_body_bytes=self.limits.max_body_bytes,
            total_s=total_s,
            deadline=deadline,
        )
        if stack is not None:
            stack.push_async_callback(reply.aclose)
        return reply

    async def call(
        self,
        target: Target,
        method: str,
        base: str,
        path: str,
        *,
        body: Any = None,
        read_s: float | None,
        total_s: float | None = None,
        request_id: str | None = None,
    ) -> Reply:
        """Send a request and read its whole answer, within `total_s` (`read_s` if not
        given)."""
        reply = await self.open(
            target,
            method,
            base,
            path,
            body=body,
            read_s=read_s,
            total_s=read_s if total_s is None else total_s,
            request_id=request_id,
        )
        try:
            await reply.read()
        finally:
            await reply.aclose()
        return reply

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()
        await self._transport.aclose()
