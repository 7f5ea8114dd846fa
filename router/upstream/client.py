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
from router.upstream.http1 import Body, Http1Pool

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


class Reply:
    """An upstream's answer whose status and headers have arrived; its body is read through
    the methods below, which translate failures. Close it (`aclose`) on every path."""

    __slots__ = ("_response", "_source", "content", "target")

    def __init__(self, target: Target, response: httpx.Response) -> None:
        self.target = target
        self._response = response
        self._source: Body | _Pump | None = None  # what `receive` reads
        self.content: bytes | None = None
        """The whole body, once `read()` has run."""

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def headers(self) -> Mapping[str, str]:
        return self._response.headers

    def is_event_stream(self) -> bool:
        content_type: str = self._response.headers.get("content-type", "")
        return content_type.startswith("text/event-stream")

    def forwarded_headers(self) -> list[tuple[bytes, bytes]]:
        """End-to-end headers only: hop-by-hop ones, and any the Connection header names, go."""
        headers = self._response.headers
        dropped = NOT_FORWARDED | {
            token.strip().lower() for token in headers.get("connection", "").split(",")
        }
        return [
            (name.lower(), value)
            for name, value in headers.raw
            if name.lower().decode("latin-1") not in dropped
        ]

    async def read(self) -> bytes:
        if self.content is None:
            try:
                self.content = await self._response.aread()
            except httpx.HTTPError as exc:
                raise transport_failure(self.target, exc) from None
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

    async def lines(self) -> AsyncIterator[str]:
        try:
            async for line in self._response.aiter_lines():
                yield line
        except httpx.HTTPError as exc:
            raise transport_failure(self.target, exc) from None

    async def chunks(self) -> AsyncIterator[bytes]:
        response = self._response
        # Bodies come as sent (requests ask for no encoding): straight off the transport,
        # without httpx's decoder and chunker, unless a server encoded one all the same.
        encoded = "content-encoding" in response.headers
        source = response.aiter_bytes() if encoded else response.stream
        try:
            async for chunk in cast(AsyncIterable[bytes], source):
                yield chunk
        except httpx.HTTPError as exc:
            raise transport_failure(self.target, exc) from None

    async def receive(self, timeout_s: float | None) -> bytes:
        """The body's next bytes, as many as have arrived; b"" once it has ended. Raises
        TimeoutError if none arrive within `timeout_s`; a timeout or a cancelled caller loses
        nothing, the next call goes on from there. Not to be mixed with `chunks()`."""
        source = self._source
        if source is None:
            stream = self._response.stream
            if isinstance(stream, Body) and "content-encoding" not in self._response.headers:
                source = self._source = stream
            else:  # another transport's body (tests), or an encoded one: read by a task
                source = self._source = _Pump(self.chunks())
        try:
            return await source.receive(timeout_s)
        except httpx.HTTPError as exc:
            raise transport_failure(self.target, exc) from None

    async def aclose(self) -> None:
        if isinstance(self._source, _Pump):
            await self._source.aclose()
        await self._response.aclose()


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
        self._pools: dict[str, httpx.AsyncBaseTransport] = {}
        self._closed = False

    def _pool(self, base: str) -> httpx.AsyncBaseTransport:
        if self._transport is not None:
            return self._transport
        pool = self._pools.get(base)
        if pool is None:
            pool = self._pools[base] = Http1Pool(self._limits)
        return pool

    def _timeout(self, read_s: float | None) -> dict[str, float | None]:
        # `read_s` bounds each wait for the answer's bytes (None: as long as it takes, for
        # answers that arrive only when generation ends).
        t = self.timeouts
        write_s = t.prefill_s if read_s is None else read_s
        return {"connect": t.connect_s, "read": read_s, "write": write_s, "pool": t.connect_s}

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
        headers = dict(_REQUEST_HEADERS)
        authorization = self._authorization.get(base)
        if authorization is not None:
            headers["authorization"] = authorization
        if request_id is not None:
            headers["x-request-id"] = request_id
        content = None
        if body is not None:
            content = orjson.dumps(body)
            headers["content-type"] = "application/json"
        request = httpx.Request(
            method,
            base + path,
            content=content,
            headers=headers,
            extensions={"timeout": self._timeout(read_s)},
        )
        try:
            response = await self._pool(base).handle_async_request(request)
        except httpx.HTTPError as exc:
            # Request legs are worth a line each; probes and cleanups fail quietly.
            level = logging.WARNING if request_id is not None else logging.DEBUG
            log.log(level, "%s %s%s failed (request %s): %r", method, base, path, request_id, exc)
            raise transport_failure(target, exc) from None
        # The answer does not keep its request: a stream may stay open for minutes, and the
        # request's body (a whole prompt) is not needed once sent.
        reply = Reply(target, response)
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
        request_id: str | None = None,
    ) -> Reply:
        """Send a request and read its whole answer."""
        async with AsyncExitStack() as stack:
            reply = await self.open(
                target,
                method,
                base,
                path,
                body=body,
                read_s=read_s,
                request_id=request_id,
                stack=stack,
            )
            await reply.read()
        return reply

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        if self._transport is not None:
            pools.append(self._transport)
        for pool in pools:
            await pool.aclose()
