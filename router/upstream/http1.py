"""HTTP/1.1 to the upstreams: the gateway's own keep-alive pool, on asyncio protocols, with
answers read by httptools (llhttp, the C parser uvicorn serves with).

httpx's own pool (httpcore over h11) parses every answer in Python: a state machine, a
receive buffer and a context manager per read, about half the gateway's CPU per relayed
chunk. Here the parser hands body bytes to a callback, and a reader wakes once per network
read however many chunks of the body it carries. A request is written in bytes, the base
URL's part of it prepared once per pool.

It speaks what the gateway needs: requests whose body is in hand, answers framed by
length, by chunks or by the connection's end; no HEAD, no upgrades, no pipelining, no
proxy. Nothing after an answer's end is read as part of it: the connection is closed
instead, and an idle connection is taken from the pool only if nothing has arrived on it
since (`_Connection.quiet`). Its failures are `transport`'s.
"""

from __future__ import annotations

import asyncio
import select
import ssl
from collections import deque
from collections.abc import Callable, Iterable
from typing import cast

import httptools

from router.upstream.transport import (
    BaseURL,
    Broken,
    Limits,
    RawHeaders,
    TimedOut,
    TransportFailure,
    Unreachable,
    Waits,
    tls_context,
)

# How much unread body a connection buffers before it stops reading from its socket.
_READ_HIGH_WATER = 256 * 1024
# Interim answers (100, 102, 103) skipped before the answer itself; more is not a server
# working on the request.
_MAX_INTERIM_ANSWERS = 8


class Http1Transport:
    """The gateway's own pool for each upstream; one TLS context shared by them all."""

    def __init__(self) -> None:
        self._tls: ssl.SSLContext | None = None

    def pool(self, base: BaseURL, limits: Limits) -> Http1Pool:
        return Http1Pool(base, limits, self._tls_context)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context()
        return self._tls

    async def aclose(self) -> None:
        pass


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Exchange:
    """One request and its answer on a connection: the answer's head as it arrives, the body
    bytes not read yet, and the reader waiting for more. It is the pool's `RawReply`: its
    connection goes back to the pool when the body has been read to its end, and is closed
    if the answer is closed before.

    `receive` can be interrupted (a timeout, a cancelled caller) without losing a byte."""

    __slots__ = (
        "_connection",
        "_deadline",
        "_deadline_timer",
        "_ended",
        "_head_bytes",
        "_header_bytes",
        "_header_count",
        "_interim_answers",
        "_limits",
        "_pool",
        "_waiter",
        "body",
        "buffered",
        "complete",
        "ends_with_connection",
        "error",
        "head_done",
        "headers",
        "keep_alive",
        "parser",
        "status",
    )

    def __init__(self, pool: Http1Pool, connection: _Connection, limits: Limits) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection  # None once released
        self._limits = limits
        self.parser = httptools.HttpResponseParser(self)
        # The answer as it arrives.
        self.status = 0
        self.headers: RawHeaders = []
        self._head_bytes = 0  # fed before the head was whole
        self._header_bytes = 0  # the headers parsed, interim answers' included
        self._header_count = 0
        self._interim_answers = 0
        self.head_done = False
        self.keep_alive = False
        self.ends_with_connection = False
        self.body: list[bytes] = []  # arrived, not read yet
        self.buffered = 0
        self.complete = False
        self.error: TransportFailure | None = None
        self._ended = False  # read to its end by `receive`
        # The one reader's wait, and its deadline, checked by one timer that outlives the
        # waits (`wait`).
        self._waiter: asyncio.Future[None] | None = None
        self._deadline: float | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None

    # What the connection hands over

    def feed_head(self, data: bytes) -> None:
        """Bytes while the head is not whole: counted against its cap as they come, before
        httptools holds a whole header (a body's bytes go to the parser straight)."""
        self._head_bytes += len(data)
        self.feed(data)
        if not self.head_done and self._head_bytes > self._limits.max_header_bytes:
            self.fail(self._head_too_large())

    def feed(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            if self.complete:  # bytes after the answer's end: never read, never reused
                self.keep_alive = False
                if self._connection is not None:
                    self._connection.close()
                return
            cause = exc.__context__  # what a callback of ours raised, if one did
            self.fail(
                cause
                if isinstance(cause, Broken)
                else Broken(f"the answer is not valid HTTP/1.1: {exc!r}")
            )

    def fail(self, error: TransportFailure) -> None:
        """The answer cannot go on: its connection is closed, its reader told."""
        if self.error is None:
            self.error = error
        if self._connection is not None:
            self._connection.close()
        self._wake()

    # httptools' callbacks (what one raises stops httptools, and `feed` fails the exchange)

    def on_message_begin(self) -> None:
        if self.complete:
            raise Broken("sent bytes after its answer's end")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        self._header_bytes += len(name) + len(value) + 4
        self._header_count += 1
        if self._header_bytes > self._limits.max_header_bytes:
            raise self._head_too_large()
        if self._header_count > self._limits.max_header_count:
            raise Broken(
                f"sent a head over max_header_count ({self._limits.max_header_count} fields)"
            )

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self._header_bytes > self._limits.max_header_bytes:
            raise self._head_too_large()
        if self.status == 101:
            raise Broken("answered 101 Switching Protocols: no upgrade was asked for")
        if self.status < 100:
            raise Broken(f"answered the status {self.status}, which HTTP does not have")
        if self.status < 200:  # an interim answer (103, ...): the real one follows
            self._interim_answers += 1
            if self._interim_answers > _MAX_INTERIM_ANSWERS:
                raise Broken(f"sent over {_MAX_INTERIM_ANSWERS} interim (1xx) answers")
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
        if not self.head_done:  # the end of an interim answer; its headers still count
            self.headers = []
            return
        self.complete = True
        self._wake()

    def _head_too_large(self) -> Broken:
        return Broken(f"sent a head over max_header_bytes ({self._limits.max_header_bytes} bytes)")

    # The reader's side

    async def receive(self, timeout_s: float | None) -> bytes:
        while self._connection is not None:
            if self.body:
                return self.take_body()
            if self.complete:
                self._ended = True
                await self.aclose()
                break
            if self.error is not None:
                raise self.error
            await self.wait(timeout_s)
        if not self._ended:
            raise self.error or Broken("the answer was closed before its end")
        return b""

    def take_body(self) -> bytes:
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body, self.buffered = [], 0
        connection = self._connection
        if connection is not None and connection.reading_paused:
            connection.resume_reading()
        return data

    async def wait(self, timeout_s: float | None) -> None:
        """Until the answer moves on (head, body bytes, its end or a failure); TimeoutError
        after `timeout_s`. Cancelling or timing out loses nothing."""
        loop = self._pool.loop
        waiter = self._waiter = loop.create_future()
        if timeout_s is not None:
            # A stream waits once per chunk, each wait far shorter than its timeout: rather
            # than a timer made and cancelled per wait, one timer runs until the deadline it
            # was set for and, if a later wait has moved the deadline on, sets itself again.
            deadline = self._deadline = loop.time() + timeout_s
            timer = self._deadline_timer
            if timer is not None and timer.when() > deadline:
                timer.cancel()
                timer = None
            if timer is None:
                self._deadline_timer = loop.call_at(deadline, self._check_deadline)
        try:
            await waiter
        finally:
            self._waiter = None
            self._deadline = None

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        if self._deadline is None:  # no wait now: the next one sets a timer
            return
        if self._pool.loop.time() < self._deadline:
            self._deadline_timer = self._pool.loop.call_at(self._deadline, self._check_deadline)
        elif self._waiter is not None:
            _time_out(self._waiter)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.body and self.error is None

    async def aclose(self) -> None:
        """Done with the answer (each exchange releases its connection once)."""
        connection, self._connection = self._connection, None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if connection is not None:
            self._pool.release(connection, self)


class _Connection(asyncio.Protocol):
    """One socket, and the exchange it carries now if any."""

    def __init__(self, pool: Http1Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.closed = False
        self.drained: asyncio.Future[None] | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.reading_paused = False
        # Its socket, asked whether anything waits to be read before it serves again.
        self._poll: select.poll | None = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self._poll = select.poll()
            self._poll.register(sock.fileno(), select.POLLIN)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None or exchange.complete:  # bytes nobody asked for: never reuse
            self.close()
            return
        if exchange.head_done:
            exchange.feed(data)
        else:
            exchange.feed_head(data)
        if exchange.buffered > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self.reading_paused = True

    def eof_received(self) -> bool:
        exchange = self.exchange
        if exchange is not None and exchange.head_done and exchange.ends_with_connection:
            if not exchange.complete:
                exchange.on_message_complete()  # this body's end is the connection's end
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        exchange = self.exchange
        if exchange is not None and not exchange.complete:
            if exc is not None:
                exchange.fail(Broken(f"the connection failed: {str(exc) or type(exc).__name__}"))
            elif exchange.head_done:
                exchange.fail(Broken("the connection closed inside the body"))
            else:
                exchange.fail(Broken("the server closed without an answer"))
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.pool.forget_idle(self)

    def pause_writing(self) -> None:
        self.drained = self.pool.loop.create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    # The pool's side

    def start(self, exchange: Exchange, request: bytes) -> None:
        """Send a request (one write) for `exchange` to read the answer to."""
        self.exchange = exchange
        assert self.transport is not None
        self.transport.write(request)

    async def drain(self, timeout_s: float | None) -> None:
        drained = self.drained
        if drained is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(drained)
        except TimeoutError:
            raise TimedOut(f"the request was not sent within {timeout_s} s") from None
        if self.closed:
            raise Broken("the connection closed while the request was sent")

    def quiet(self) -> bool:
        """Open, and nothing has arrived since its last answer: what an idle connection must
        be to serve again. The event loop may not have read what is waiting in the socket
        yet (a second answer nobody asked for, or the server's close), so the socket itself
        is asked, without waiting: one poll(2). Without a socket to ask, never."""
        return not self.closed and self._poll is not None and not self._poll.poll(0)

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Pool:
    """Keep-alive connections to one upstream base URL, held to its `Limits`."""

    def __init__(self, base: BaseURL, limits: Limits, tls: Callable[[], ssl.SSLContext]) -> None:
        self.loop = asyncio.get_running_loop()
        self._base = base
        self._limits = limits
        self._tls = tls
        self._head = header_lines(base.headers)
        self._prefix = base.prefix.encode("ascii")
        self._idle: list[_Connection] = []
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def send(
        self,
        method: str,
        path: str,
        headers: RawHeaders,
        content: bytes | None,
        waits: Waits,
    ) -> Exchange:
        request = self._request(method, path, headers, content)
        connection = await self._acquire(waits.pool_s, waits.connect_s)
        exchange = Exchange(self, connection, self._limits)
        try:
            connection.start(exchange, request)
            await connection.drain(waits.write_s)
            # The head is waited for whole: a head trickling in byte by byte ends too.
            start = self.loop.time()
            head_deadline = waits.deadline
            if waits.read_s is not None:
                by_read = start + waits.read_s
                head_deadline = by_read if head_deadline is None else min(head_deadline, by_read)
            while not exchange.head_done:
                if exchange.error is not None:
                    raise exchange.error
                left = None if head_deadline is None else head_deadline - self.loop.time()
                if left is not None and left <= 0:
                    raise TimeoutError
                await exchange.wait(left)
        except TimeoutError:
            connection.close()
            await exchange.aclose()
            allowed = "" if head_deadline is None else f" within {head_deadline - start:g} s"
            raise TimedOut(f"no whole answer head{allowed}") from None
        except BaseException:
            connection.close()
            await exchange.aclose()
            raise
        return exchange

    def _request(self, method: str, path: str, headers: RawHeaders, content: bytes | None) -> bytes:
        """A whole request in bytes: its line, its headers, its body."""
        line = b"%s %s%s HTTP/1.1\r\n" % (method.encode("ascii"), self._prefix, path.encode())
        if content is not None:
            length = b"content-length: %d\r\n" % len(content)
        elif method in ("POST", "PUT", "PATCH"):
            length = b"content-length: 0\r\n"
        else:
            length = b""
        return b"".join((line, self._head, header_lines(headers), length, b"\r\n", content or b""))

    async def _acquire(self, pool_s: float | None, connect_s: float | None) -> _Connection:
        deadline = None if pool_s is None else self.loop.time() + pool_s
        while True:
            if self._closed:
                raise Unreachable("the connection pool is closed")
            while self._idle:
                connection = self._idle.pop()  # the most recently used: the rest may expire
                if connection.idle_timer is not None:
                    connection.idle_timer.cancel()
                    connection.idle_timer = None
                if connection.quiet():
                    return connection
                connection.close()  # closed by its server, or holding what nobody asked for
                self._open -= 1
            if self._open < self._limits.max_connections:
                self._open += 1
                try:
                    return await self._connect(connect_s)
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
                raise Unreachable(f"no connection was free within {pool_s} s") from None
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # woken, but gone: pass it on
                    self._wake_a_waiter()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                if waiter in self._slot_waiters:  # timed out or cancelled, not woken
                    self._slot_waiters.remove(waiter)

    async def _connect(self, connect_s: float | None) -> _Connection:
        base = self._base
        tls = self._tls() if base.scheme == "https" else None
        try:
            async with asyncio.timeout(connect_s):
                _, connection = await self.loop.create_connection(
                    lambda: _Connection(self),
                    base.host,
                    base.port,
                    ssl=tls,
                    server_hostname=base.host if tls is not None else None,
                )
        except TimeoutError:
            raise Unreachable(f"no connection within {connect_s} s") from None
        except (OSError, ssl.SSLError) as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from None
        return connection

    def release(self, connection: _Connection, exchange: Exchange) -> None:
        """Take a connection back after its exchange: idle if it can serve another, else
        closed."""
        connection.exchange = None
        if (
            self._closed
            or connection.closed
            or not exchange.reusable()
            or len(self._idle) >= self._limits.max_idle_connections
        ):
            connection.close()
            self._open -= 1
        else:
            connection.idle_timer = self.loop.call_later(
                self._limits.idle_expiry_s, connection.close
            )
            self._idle.append(connection)
        self._wake_a_waiter()

    def forget_idle(self, connection: _Connection) -> None:
        """An idle connection closed (by its server, or on expiry): it no longer counts."""
        if connection in self._idle:
            self._idle.remove(connection)
            if connection.idle_timer is not None:
                connection.idle_timer.cancel()
            self._open -= 1
            self._wake_a_waiter()

    def _wake_a_waiter(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
            self._open -= 1


def header_lines(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """`name: value` lines; Unreachable for a header that holds a line break (it would
    split the request)."""
    lines = []
    for name, value in headers:
        if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
            raise Unreachable(f"header {name!r} holds a line break: the request is not sent")
        lines.append(b"%s: %s\r\n" % (name, value))
    return b"".join(lines)
