"""HTTP/1.1 to the upstreams: a keep-alive connection pool per upstream, on asyncio
protocols, with answers read by httptools (llhttp, the C parser uvicorn serves with).

httpx's own pool (httpcore over h11) parses every answer in Python: a state machine, a
receive buffer and a context manager per read, about half the gateway's CPU per relayed
chunk. Here the parser hands body bytes to a callback, and a reader wakes once per network
read however many chunks of the body it carries.

`Http1Pool.exchange` sends a request already in bytes and returns its answer's `Body`
(status and headers included): no per-request objects beyond the bytes themselves. The
pool is also an `httpx.AsyncBaseTransport` over the same exchange. Its failures are
httpx's exceptions (`failures.transport_failure` translates them). It speaks what the
gateway needs: requests whose body is in hand, answers framed by length, by chunks or by
the connection's end; no HEAD, no upgrades, no pipelining.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from collections import deque
from collections.abc import AsyncIterator, Iterable
from typing import cast

import httptools
import httpx

# How much unread body a connection buffers before it stops reading from its socket.
_READ_HIGH_WATER = 256 * 1024

Origin = tuple[bytes, bytes, int]  # scheme, host, port


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Connection(asyncio.Protocol):
    """One socket and the answer being read on it: its head, the body bytes that arrived
    and were not read yet, and whoever waits for more."""

    def __init__(self, pool: Http1Pool, origin: Origin) -> None:
        self.pool = pool
        self.origin = origin
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.waiter: asyncio.Future[None] | None = None
        # The wait's deadline, checked by one timer that outlives the waits (`wait`).
        self.deadline: float | None = None
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.drained: asyncio.Future[None] | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self._reading_paused = False
        # The answer in progress (parser is None between exchanges).
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.ends_with_connection = False
        self.body: list[bytes] = []
        self.buffered = 0
        self.error: httpx.TransportError | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None or self.complete:  # bytes nobody asked for: never reuse this socket
            self.close()
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"the answer is not valid HTTP/1.1: {exc}"))
            self.close()
            return
        if self.buffered > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True

    def eof_received(self) -> bool:
        if self.head_done and self.ends_with_connection and not self.complete:
            self.on_message_complete()  # this body's end is the connection's end
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.parser is not None and not self.complete:
            if exc is not None:
                self._fail(httpx.ReadError(str(exc) or type(exc).__name__))
            elif self.head_done:
                self._fail(httpx.RemoteProtocolError("the connection closed inside the body"))
            else:
                self._fail(httpx.RemoteProtocolError("the server closed without an answer"))
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.pool.forget_idle(self)

    def pause_writing(self) -> None:
        self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    # httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        if self.status < 200:  # an interim answer (103, ...): the real one follows
            return
        self.head_done = True
        self.keep_alive = self.parser.should_keep_alive()
        framed = any(
            name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers
        )
        self.ends_with_connection = not framed and self.status not in (204, 304)
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        if not self.head_done:  # the end of an interim answer
            self.headers = []
            return
        self.complete = True
        self._wake()

    # The pool's side

    def start(self, request: bytes) -> None:
        """Send a request (one write) and get ready for its answer."""
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.headers, self.head_done, self.complete = 0, [], False, False
        self.body, self.buffered, self.error = [], 0, None
        assert self.transport is not None
        self.transport.write(request)

    def take_body(self) -> bytes:
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body, self.buffered = [], 0
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def wait(self, timeout: float | None) -> None:  # noqa: ASYNC109
        """Until the answer moves on (head, body bytes, its end or a failure); TimeoutError
        after `timeout` seconds. Cancelling or timing out loses nothing."""
        waiter = self.waiter = self.loop.create_future()
        if timeout is not None:
            # A stream waits once per chunk, each wait far shorter than its timeout: rather
            # than a timer made and cancelled per wait, one timer runs until the deadline it
            # was set for and, if a later wait has moved the deadline on, sets itself again.
            deadline = self.deadline = self.loop.time() + timeout
            timer = self.deadline_timer
            if timer is not None and timer.when() > deadline:
                timer.cancel()
                timer = None
            if timer is None:
                self.deadline_timer = self.loop.call_at(deadline, self._check_deadline)
        try:
            await waiter
        finally:
            self.waiter = None
            self.deadline = None

    def disarm(self) -> None:
        """No wait is left to time out (the exchange is over)."""
        if self.deadline_timer is not None:
            self.deadline_timer.cancel()
            self.deadline_timer = None

    def _check_deadline(self) -> None:
        self.deadline_timer = None
        if self.deadline is None:  # no wait now: the next one sets a timer
            return
        if self.loop.time() < self.deadline:
            self.deadline_timer = self.loop.call_at(self.deadline, self._check_deadline)
        elif self.waiter is not None:
            _time_out(self.waiter)

    async def drain(self, timeout: float | None) -> None:  # noqa: ASYNC109
        drained = self.drained
        if drained is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(drained)
        except TimeoutError:
            raise httpx.WriteTimeout("timed out") from None
        if self.closed and self.error is None:
            raise httpx.WriteError("the connection closed while the request was sent")

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and not self.body

    def close(self) -> None:
        self.closed = True
        self.disarm()
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: httpx.TransportError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class Body(httpx.AsyncByteStream):
    """An answer whose head has arrived (`status`, raw `headers`), and its body, read off
    its connection; the connection goes back to the pool when the body has been read to its
    end, and is closed if it is closed before.

    Read it by iterating (each wait for bytes bounded by the read timeout) or with
    `receive`, which a timeout or a cancelled caller can interrupt without losing a byte."""

    def __init__(self, pool: Http1Pool, connection: _Connection, read_s: float | None) -> None:
        self.status = connection.status
        self.headers = connection.headers
        self._pool = pool
        self._connection: _Connection | None = connection
        self._read_s = read_s
        self._ended = False

    async def receive(self, timeout: float | None) -> bytes:  # noqa: ASYNC109
        """The body's next bytes, however many have arrived; b"" once it has ended.
        TimeoutError if none arrive within `timeout` seconds: they are read by the next call."""
        connection = self._connection
        while connection is not None:
            if connection.body:
                return connection.take_body()
            if connection.complete:
                self._ended = True
                await self.aclose()
                break
            if connection.error is not None:
                raise connection.error
            await connection.wait(timeout)
        if not self._ended:
            raise httpx.StreamClosed()
        return b""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while chunk := await self.receive(self._read_s):
                yield chunk
        except TimeoutError:
            raise httpx.ReadTimeout("timed out") from None

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection)


class Http1Pool(httpx.AsyncBaseTransport):
    """Keep-alive connections per origin, at most `limits.max_connections` open at once
    (a request waits for one up to its pool timeout), at most
    `limits.max_keepalive_connections` of them idle, each idle one closed after
    `limits.keepalive_expiry` seconds."""

    def __init__(self, limits: httpx.Limits) -> None:
        self.loop = asyncio.get_running_loop()
        unlimited = sys.maxsize  # what None means in httpx's limits
        self._max_connections = limits.max_connections or unlimited
        idle = limits.max_keepalive_connections
        self._max_idle = unlimited if idle is None else idle
        self._expiry = limits.keepalive_expiry
        self._ssl_context: ssl.SSLContext | None = None
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = origin_of(url)
        timeouts = request.extensions.get("timeout", {})
        body = (
            request.content
            if isinstance(request.stream, httpx.ByteStream)
            else b"".join([chunk async for chunk in cast(httpx.AsyncByteStream, request.stream)])
        )
        head = request_head(request.method.encode(), url.raw_path, request.headers.raw)
        answer = await self.exchange(
            origin,
            head + body,
            pool_s=timeouts.get("pool"),
            connect_s=timeouts.get("connect"),
            write_s=timeouts.get("write"),
            read_s=timeouts.get("read"),
        )
        return httpx.Response(
            status_code=answer.status,
            headers=answer.headers,
            stream=answer,
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def exchange(
        self,
        origin: Origin,
        request: bytes,
        *,
        pool_s: float | None,
        connect_s: float | None,
        write_s: float | None,
        read_s: float | None,
    ) -> Body:
        """Send `request` (its head and body, in bytes) to `origin` on a pooled connection;
        return once the answer's head has arrived. `read_s` bounds each wait for bytes."""
        connection = await self._acquire(origin, pool_s, connect_s)
        try:
            connection.start(request)
            await connection.drain(write_s)
            while not connection.head_done:
                if connection.error is not None:
                    raise connection.error
                await connection.wait(read_s)
        except TimeoutError:
            connection.close()
            self.release(connection)
            raise httpx.ReadTimeout("timed out") from None
        except BaseException:
            connection.close()
            self.release(connection)
            raise
        return Body(self, connection, read_s)

    async def _acquire(
        self,
        origin: Origin,
        pool_s: float | None,
        connect_s: float | None,
    ) -> _Connection:
        deadline = None if pool_s is None else self.loop.time() + pool_s
        while True:
            if self._closed:
                raise httpx.ConnectError("the connection pool is closed")
            idle = self._idle.get(origin)
            while idle:
                connection = idle.pop()  # the most recently used: the rest may expire
                if connection.idle_timer is not None:
                    connection.idle_timer.cancel()
                    connection.idle_timer = None
                if not connection.closed:
                    return connection
                self._open -= 1
            if self._open < self._max_connections:
                self._open += 1
                try:
                    return await self._connect(origin, connect_s)
                except BaseException:
                    self._open -= 1
                    self._wake_a_waiter()
                    raise
            waiter = self.loop.create_future()
            self._slot_waiters.append(waiter)
            timer = None if deadline is None else self.loop.call_at(deadline, _time_out, waiter)
            try:
                await waiter
            except TimeoutError:
                raise httpx.PoolTimeout("no connection was free in time") from None
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # woken, but gone: pass it on
                    self._wake_a_waiter()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                if waiter in self._slot_waiters:  # timed out or cancelled, not woken
                    self._slot_waiters.remove(waiter)

    async def _connect(self, origin: Origin, connect_s: float | None) -> _Connection:
        scheme, host, port = origin
        tls = None
        if scheme == b"https":
            if self._ssl_context is None:
                self._ssl_context = httpx.create_ssl_context()
            tls = self._ssl_context
        hostname = host.decode("ascii")
        try:
            async with asyncio.timeout(connect_s):
                _, connection = await self.loop.create_connection(
                    lambda: _Connection(self, origin),
                    hostname,
                    port,
                    ssl=tls,
                    server_hostname=hostname if tls is not None else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from None
        return connection

    def release(self, connection: _Connection) -> None:
        """Take a connection back after an exchange: idle if it can serve another, else
        closed. Each exchange releases its connection once."""
        if self._closed or not connection.reusable() or self._idle_count() >= self._max_idle:
            connection.close()
            self._open -= 1
        else:
            connection.parser = None
            connection.disarm()
            if self._expiry is not None:
                connection.idle_timer = self.loop.call_later(self._expiry, connection.close)
            self._idle.setdefault(connection.origin, []).append(connection)
        self._wake_a_waiter()

    def forget_idle(self, connection: _Connection) -> None:
        """An idle connection closed (by its server, or on expiry): it no longer counts."""
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)
            if connection.idle_timer is not None:
                connection.idle_timer.cancel()
            self._open -= 1
            self._wake_a_waiter()

    def _idle_count(self) -> int:
        return sum(len(idle) for idle in self._idle.values())

    def _wake_a_waiter(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: httpx.URL) -> Origin:
    """The pool's key for `url`: scheme, host, and port (the scheme's own if none is given)."""
    return (url.raw_scheme, url.raw_host, url.port or _DEFAULT_PORTS[url.scheme])


def request_head(method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """A request's line and headers, up to the blank line."""
    return b"%s %s HTTP/1.1\r\n%s\r\n" % (method, target, header_lines(headers))


def header_lines(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """`name: value` lines; LocalProtocolError for a header that holds a line break (it
    would split the request)."""
    lines = []
    for name, value in headers:
        if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
            raise httpx.LocalProtocolError(f"header {name!r} holds a line break")
        lines.append(b"%s: %s\r\n" % (name, value))
    return b"".join(lines)
