"""The one way the gateway calls a backend: `Upstreams` keeps one connection pool per
upstream server, sized by `upstreams` in router.yaml, with timeouts from `timeouts` only.

A call names its `Target` (for errors) and how long each wait for the answer's bytes may
last; its answer is a `Reply`, whose body is read whole, line by line or chunk by chunk.
Every httpx failure, at any of those steps, surfaces as a `router.errors.UpstreamError`:
nothing above this package sees httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from contextlib import AsyncExitStack
from typing import Any, cast

import httpx
import orjson

from router.config import TimeoutsConfig, UpstreamsConfig
from router.errors import UpstreamError
from router.upstream.failures import Target, status_failure, transport_failure
from router.upstream.http1 import Body, Http1Pool, header_lines, origin_of

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

# Every request's headers, as httpx's client sends them, but for an identity encoding:
# bodies are relayed as they come.
_REQUEST_HEADERS = {
    "accept": "*/*",
    "accept-encoding": "identity",
    "connection": "keep-alive",
    "user-agent": f"python-httpx/{httpx.__version__}",
}

RawHeaders = list[tuple[bytes, bytes]]


class Reply:
    """An upstream's answer whose status and headers have arrived; its body is read through
    the methods below, which translate failures. Close it (`aclose`) on every path."""

    __slots__ = ("_body", "_raw_headers", "_source", "content", "status", "target")

    def __init__(
        self, target: Target, status: int, headers: RawHeaders, body: httpx.AsyncByteStream
    ) -> None:
        self.target = target
        self.status = status
        self._raw_headers = headers
        self._body = body
        self._source: Body | _Pump | None = None  # what `receive` reads
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
        if self.content is None:
            self.content = b"".join([chunk async for chunk in self.chunks()])
        return self.content

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

    async def chunks(self) -> AsyncIterator[bytes]:
        # Bodies come as sent (requests ask for no encoding): straight off the transport,
        # unless a server encoded one all the same: then through httpx's decoder.
        source: AsyncIterable[bytes] = self._body
        if self._encoded():
            decoded = httpx.Response(self.status, headers=self._raw_headers, stream=self._body)
            source = decoded.aiter_bytes()
        try:
            async for chunk in source:
                yield chunk
        except httpx.HTTPError as exc:
            raise transport_failure(self.target, exc) from None

    async def receive(self, timeout_s: float | None) -> bytes:
        """The body's next bytes, as many as have arrived; b"" once it has ended. Raises
        TimeoutError if none arrive within `timeout_s`; a timeout or a cancelled caller loses
        nothing, the next call goes on from there. Not to be mixed with `chunks()`."""
        source = self._source
        if source is None:
            body = self._body
            if isinstance(body, Body) and not self._encoded():
                source = self._source = body
            else:  # another transport's body (tests), or an encoded one: read by a task
                source = self._source = _Pump(self.chunks())
        try:
            return await source.receive(timeout_s)
        except httpx.HTTPError as exc:
            raise transport_failure(self.target, exc) from None

    async def aclose(self) -> None:
        if isinstance(self._source, _Pump):
            await self._source.aclose()
        await self._body.aclose()

    def _header(self, name: bytes) -> bytes | None:
        for key, value in self._raw_headers:
            if key.lower() == name:
                return value
        return None

    def _encoded(self) -> bool:
        return self._header(b"content-encoding") is not None


class _Pump:
    """`receive` over any body: a task reads it into a buffer, so a timed-out or cancelled
    wait never interrupts the read itself."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._buffer: deque[bytes | BaseException] = deque()
        self._arrived = asyncio.Event()
        self._reader = asyncio.ensure_future(self._read(chunks))

    async def _read(self, chunks: AsyncIterator[bytes]) -> None:
        try:
            async for chunk in chunks:
                self._buffer.append(chunk)
                self._arrived.set()
            self._buffer.append(EOFError())
        except Exception as exc:
            self._buffer.append(exc)
        self._arrived.set()

    async def receive(self, timeout_s: float | None) -> bytes:
        while not self._buffer:
            self._arrived.clear()
            async with asyncio.timeout(timeout_s):
                await self._arrived.wait()
        item = self._buffer[0]
        if isinstance(item, EOFError):
            return b""  # the end stays in the buffer: every later call sees it too
        if isinstance(item, BaseException):
            raise item  # so does a failure
        self._buffer.popleft()
        return item

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Upstreams:
    """Pooled connections, one pool per upstream base URL, made on first use and closed
    together.

    Requests go to the pool's transport directly: httpx's client layer (redirects, auth
    flows, event hooks, a cookie jar that every answer updates and every request shares)
    is nothing the gateway uses, and it costs every request a few layers.

    `transport` replaces the network (tests pass an `httpx.MockTransport`)."""

    def __init__(
        self,
        pools: UpstreamsConfig,
        timeouts: TimeoutsConfig,
        *,
        credentials: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """`credentials`: base URL -> the API key that backend expects."""
        self.timeouts = timeouts
        self._limits = httpx.Limits(
            max_connections=pools.max_connections,
            max_keepalive_connections=pools.max_keepalive_connections,
            keepalive_expiry=pools.keepalive_expiry_s,
        )
        self._transport = transport
        self._authorization = {base: f"Bearer {key}" for base, key in (credentials or {}).items()}
        self._upstreams: dict[str, _Upstream] = {}
        self._closed = False

    def _upstream(self, base: str) -> _Upstream:
        upstream = self._upstreams.get(base)
        if upstream is None:
            upstream = self._upstreams[base] = _Upstream(
                base, Http1Pool(self._limits), self._authorization.get(base)
            )
        return upstream

    async def open(
        self,
        target: Target,
        method: str,
        base: str,
        path: str,
        *,
        body: Any = None,
        read_s: float | None,
        request_id: str | None = None,
        stack: AsyncExitStack | None = None,
    ) -> Reply:
        """Send a request; return once its status and headers have arrived. The reply is
        closed when `stack` unwinds, if one is given; otherwise by the caller."""
        if self._closed:
            raise target.failure("unreachable", "is not called: the gateway is closing", status=502)
        content = None if body is None else orjson.dumps(body)
        t = self.timeouts
        # `read_s` bounds each wait for the answer's bytes (None: as long as it takes, for
        # answers that arrive only when generation ends).
        write_s = t.prefill_s if read_s is None else read_s
        try:
            if self._transport is not None:
                response = await self._foreign(
                    method, base, path, content, request_id, t.connect_s, write_s, read_s
                )
                answer = cast(httpx.AsyncByteStream, response.stream)
                status, headers = response.status_code, response.headers.raw
            else:
                upstream = self._upstream(base)
                answer = await upstream.pool.exchange(
                    upstream.origin,
                    upstream.request(method, path, content, request_id),
                    pool_s=t.connect_s,
                    connect_s=t.connect_s,
                    write_s=write_s,
                    read_s=read_s,
                )
                status, headers = answer.status, answer.headers
        except httpx.HTTPError as exc:
            # Request legs are worth a line each; probes and cleanups fail quietly.
            level = logging.WARNING if request_id is not None else logging.DEBUG
            log.log(level, "%s %s%s failed (request %s): %r", method, base, path, request_id, exc)
            raise transport_failure(target, exc) from None
        # The answer does not keep its request: a stream may stay open for minutes, and the
        # request's body (a whole prompt) is not needed once sent.
        reply = Reply(target, status, headers, answer)
        if stack is not None:
            stack.push_async_callback(reply.aclose)
        return reply

    async def _foreign(
        self,
        method: str,
        base: str,
        path: str,
        content: bytes | None,
        request_id: str | None,
        connect_s: float,
        write_s: float,
        read_s: float | None,
    ) -> httpx.Response:
        """The request through the transport given in place of the network."""
        assert self._transport is not None
        timeout = {"connect": connect_s, "read": read_s, "write": write_s, "pool": connect_s}
        request = httpx.Request(
            method,
            base + path,
            content=content,
            headers=_headers(self._authorization.get(base), request_id, content),
            extensions={"timeout": timeout},
        )
        return await self._transport.handle_async_request(request)

    async def call(
        self,
        target: Target,
        method: str,
        base: str,
        path: str,
        *,
        body: Any = None,
        read_s: float | None,
        request_id: str | None = None,
    ) -> Reply:
        """Send a request and read its whole answer."""
        reply = await self.open(
            target, method, base, path, body=body, read_s=read_s, request_id=request_id
        )
        try:
            await reply.read()
        finally:
            await reply.aclose()
        return reply

    async def aclose(self) -> None:
        self._closed = True
        upstreams, self._upstreams = list(self._upstreams.values()), {}
        for upstream in upstreams:
            await upstream.pool.aclose()
        if self._transport is not None:
            await self._transport.aclose()


def _headers(
    authorization: str | None, request_id: str | None, content: bytes | None
) -> dict[str, str]:
    headers = dict(_REQUEST_HEADERS)
    if authorization is not None:
        headers["authorization"] = authorization
    if request_id is not None:
        headers["x-request-id"] = request_id
    if content is not None:
        headers["content-type"] = "application/json"
    return headers


class _Upstream:
    """One upstream base URL: its pool, and the headers every request to it carries, in
    bytes once for all its requests."""

    __slots__ = ("_common", "_prefix", "origin", "pool")

    def __init__(self, base: str, pool: Http1Pool, authorization: str | None) -> None:
        url = httpx.URL(base)
        self.pool = pool
        self.origin = origin_of(url)
        self._prefix = url.raw_path.rstrip(b"/")
        host = url.raw_host if url.port is None else b"%s:%d" % (url.raw_host, url.port)
        common = [(b"host", host)] + [
            (name.encode(), value.encode())
            for name, value in _headers(authorization, None, None).items()
        ]
        self._common = header_lines(common)

    def request(
        self, method: str, path: str, content: bytes | None, request_id: str | None
    ) -> bytes:
        """A whole request in bytes: its line, its headers, its body."""
        extra = []
        if request_id is not None:
            extra.append((b"x-request-id", request_id.encode("latin-1")))
        if content is not None:
            extra.append((b"content-type", b"application/json"))
            extra.append((b"content-length", b"%d" % len(content)))
        elif method in ("POST", "PUT", "PATCH"):
            extra.append((b"content-length", b"0"))
        target = self._prefix + path.encode("ascii")
        line = b"%s %s HTTP/1.1\r\n" % (method.encode("ascii"), target)
        return b"".join((line, self._common, header_lines(extra), b"\r\n", content or b""))
