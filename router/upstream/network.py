"""The sockets under the upstream connection pool, on asyncio directly.

httpcore's default network layer goes through anyio, which costs a cancel scope, two
checkpoints and a backend lookup for every read and every write: per line of a decode
stream. Here a read is a wait on a future with one timer, and writes made in the same
turn of the loop leave in one system call (a request's head and its body, for instance).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any, cast

import httpcore

# What `socket.setsockopt` takes, as httpcore passes it.
SocketOption = tuple[Any, ...]

# How much unread data a connection buffers before it stops reading from its socket.
_READ_HIGH_WATER = 256 * 1024


class _Connection(asyncio.Protocol):
    """One socket's state: bytes received and not yet read, whoever waits for them, and
    writes waiting for the end of this turn of the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()
        self.eof = False
        self.lost: BaseException | None = None
        self.closed = False
        self.waiter: asyncio.Future[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.outgoing: list[bytes] = []
        self._reading_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self.received += data
        if len(self.received) > _READ_HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = exc
        self._wake()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self) -> None:
        self.drained = self.loop.create_future()

    def resume_writing(self) -> None:
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None

    def take(self, max_bytes: int) -> bytes:
        data = bytes(self.received[:max_bytes])
        del self.received[:max_bytes]
        if self._reading_paused and len(self.received) <= _READ_HIGH_WATER // 2:
            self._reading_paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
        return data

    def queue(self, data: bytes) -> None:
        if not self.outgoing:
            self.loop.call_soon(self.flush)
        self.outgoing.append(data)

    def flush(self) -> None:
        if self.outgoing and self.transport is not None and not self.closed:
            data = self.outgoing[0] if len(self.outgoing) == 1 else b"".join(self.outgoing)
            self.transport.write(data)
        self.outgoing.clear()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class AsyncioStream(httpcore.AsyncNetworkStream):
    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        connection = self._connection
        if not connection.received and not connection.eof and not connection.closed:
            connection.flush()
            waiter = connection.waiter = connection.loop.create_future()
            timer = (
                None if timeout is None else connection.loop.call_later(timeout, _time_out, waiter)
            )
            try:
                await waiter
            except TimeoutError:
                raise httpcore.ReadTimeout("timed out") from None
            finally:
                connection.waiter = None
                if timer is not None:
                    timer.cancel()
        if connection.received:
            return connection.take(max_bytes)
        if connection.lost is not None:
            raise httpcore.ReadError(str(connection.lost) or type(connection.lost).__name__)
        return b""  # the peer closed the connection

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        connection = self._connection
        if not buffer:
            return
        if connection.closed:
            raise httpcore.WriteError("the connection is closed")
        connection.queue(buffer)
        drained = connection.drained
        if drained is not None:  # the socket's send buffer is full: wait for room
            connection.flush()
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(drained)
            except TimeoutError:
                raise httpcore.WriteTimeout("timed out") from None

    async def aclose(self) -> None:
        connection = self._connection
        connection.flush()
        if connection.transport is not None and not connection.closed:
            connection.transport.close()
        connection.closed = True

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
    ) -> httpcore.AsyncNetworkStream:
        connection = self._connection
        assert connection.transport is not None
        try:
            async with asyncio.timeout(timeout):
                transport = await connection.loop.start_tls(
                    connection.transport, connection, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError:
            raise httpcore.ConnectTimeout("timed out") from None
        except (OSError, ssl.SSLError) as exc:
            raise httpcore.ConnectError(str(exc)) from None
        connection.transport = cast(asyncio.Transport, transport)
        return self

    def get_extra_info(self, info: str) -> Any:
        connection = self._connection
        if info == "is_readable":
            # An idle connection with something to read has been closed by its server.
            return bool(connection.received) or connection.eof or connection.closed
        if connection.transport is None:
            return None
        if info == "ssl_object":
            return connection.transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return connection.transport.get_extra_info("sockname")
        if info == "server_addr":
            return connection.transport.get_extra_info("peername")
        if info == "socket":
            return connection.transport.get_extra_info("socket")
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's interface)
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        connection = _Connection(loop)
        local = None if local_address is None else (local_address, 0)
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(lambda: connection, host, port, local_addr=local)
        except TimeoutError:
            raise httpcore.ConnectTimeout("timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from None
        assert connection.transport is not None
        sock: socket.socket | None = connection.transport.get_extra_info("socket")
        for option in socket_options or ():
            if sock is not None:
                sock.setsockopt(*option)
        return AsyncioStream(connection)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
