"""The upstreams over httpx's transports: its own pool (`httpx.AsyncHTTPTransport`, one per
upstream base URL, sized by the `Limits`), or one given transport for every upstream (an
`httpx.MockTransport` scripting the upstreams in tests).

An httpx `Request` and `Response` per call and h11's parsing in Python make this the slower
transport; it is the reference the gateway's own pool is tested against. httpx's
exceptions end here, as `transport`'s failures.

Nothing after an answer's end is read as part of it, as in the gateway's own pool: httpcore
would keep bytes that came in the same read as the answer's end in h11's buffer and read
them as the answer to the connection's next request, so a connection holding any is closed
before it goes back to httpx's pool (which drops a closed connection, as it does one the
server closed). Bytes arriving later make the idle connection readable, which httpx's pool
already takes for a closed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from typing import cast

import httpx

from router.upstream.transport import (
    BaseURL,
    Broken,
    Limits,
    RawHeaders,
    TimedOut,
    TransportFailure,
    Unreachable,
    Waits,
    header_bytes,
    tls_context,
)

_NEVER_SENT = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,  # a request that could not be written: nothing left
)


def translated(exc: httpx.HTTPError) -> TransportFailure:
    """httpx's failure in the transport's words."""
    message = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, _NEVER_SENT):
        return Unreachable(message)
    if isinstance(exc, httpx.TimeoutException):
        return TimedOut(message)
    return Broken(message)


class HttpxTransport:
    """`transport`: the one httpx transport every upstream is reached through (the caller
    closes it); without one, an `httpx.AsyncHTTPTransport` per upstream, verifying TLS as
    the gateway's own pool does, and no proxy."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._shared = transport
        self._tls: ssl.SSLContext | None = None

    def pool(self, base: BaseURL, limits: Limits) -> HttpxPool:
        if self._shared is not None:
            return HttpxPool(base, limits, self._shared, owned=False)
        own = httpx.AsyncHTTPTransport(
            verify=self._tls_context(),
            limits=httpx.Limits(
                max_connections=limits.max_connections,
                max_keepalive_connections=limits.max_idle_connections,
                keepalive_expiry=limits.idle_expiry_s,
            ),
        )
        return HttpxPool(base, limits, own, owned=True)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context()
        return self._tls

    async def aclose(self) -> None:
        pass


class HttpxPool:
    """One upstream base URL through an httpx transport."""

    def __init__(
        self,
        base: BaseURL,
        limits: Limits,
        transport: httpx.AsyncBaseTransport,
        *,
        owned: bool,
    ) -> None:
        self._base = base
        self._limits = limits
        self._transport = transport
        self._owned = owned

    async def send(
        self,
        method: str,
        path: str,
        headers: RawHeaders,
        content: bytes | None,
        waits: Waits,
    ) -> HttpxReply:
        timeout = {
            "pool": waits.pool_s,
            "connect": waits.connect_s,
            "write": waits.write_s,
            "read": waits.read_s,
        }
        try:
            request = httpx.Request(
                method,
                self._base.url + path,
                headers=[*self._base.headers, *headers],
                content=content,
                extensions={"timeout": timeout},
            )
            async with asyncio.timeout_at(waits.deadline):
                response = await self._transport.handle_async_request(request)
        except TimeoutError:
            raise TimedOut("no whole answer head by the answer's deadline") from None
        except httpx.HTTPError as exc:
            raise translated(exc) from None
        except httpx.InvalidURL as exc:  # not an HTTPError, but nothing was sent either
            raise Unreachable(f"InvalidURL: {exc}") from None
        answer = HttpxReply(response)
        refusal = self._refusal(answer)
        if refusal is not None:
            await answer.aclose()
            raise refusal
        return answer

    def _refusal(self, answer: HttpxReply) -> Broken | None:
        limits = self._limits
        if header_bytes(answer.headers) > limits.max_header_bytes:
            return Broken(f"sent a head over max_header_bytes ({limits.max_header_bytes} bytes)")
        if len(answer.headers) > limits.max_header_count:
            return Broken(f"sent a head over max_header_count ({limits.max_header_count} fields)")
        if answer.status == 101:
            return Broken("answered 101 Switching Protocols: no upgrade was asked for")
        return None

    async def aclose(self) -> None:
        if self._owned:
            await self._transport.aclose()


def _unread_after_end(stream: object) -> bytes | None:
    """What h11 holds past the answer's end on the connection behind `stream` (httpx's
    stream over httpcore's pool over its HTTP/1.1 connection); None when that connection
    cannot be found (another httpcore's layout)."""
    try:
        connection = stream._httpcore_stream._stream._connection  # type: ignore[attr-defined]
        unread, _ = connection._h11_state.trailing_data
    except AttributeError:
        return None
    return bytes(unread)


class HttpxReply:
    """An httpx response's body read by a task into a buffer, so that a timed-out or
    cancelled `receive` never interrupts the read itself."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.headers: RawHeaders = response.headers.raw
        self._stream = cast(httpx.AsyncByteStream, response.stream)
        # The connection's socket, when there is one (not with a scripted transport).
        self._network_stream = response.extensions.get("network_stream")
        self._buffer: deque[bytes | BaseException] = deque()
        self._arrived = asyncio.Event()
        self._reader: asyncio.Future[None] | None = None

    async def _read(self) -> None:
        try:
            async for chunk in self._stream:
                self._buffer.append(chunk)
                self._arrived.set()
            if self._network_stream is not None and _unread_after_end(self._stream) != b"":
                # Bytes after the answer's end, or no telling: never reused. The answer is
                # whole whatever closing the socket raises.
                with contextlib.suppress(Exception):
                    await self._network_stream.aclose()
            await self._stream.aclose()  # read to its end: its connection serves again
            self._buffer.append(EOFError())
        except httpx.HTTPError as exc:
            self._buffer.append(translated(exc))
        except Exception as exc:  # a scripted transport's own: the reader must hear of it too
            self._buffer.append(Broken(f"{type(exc).__name__}: {exc}"))
        self._arrived.set()

    async def receive(self, timeout_s: float | None) -> bytes:
        if self._reader is None:
            self._reader = asyncio.ensure_future(self._read())
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
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        try:
            await self._stream.aclose()
        except httpx.HTTPError:
            pass  # closing a broken answer: nothing left to tell
