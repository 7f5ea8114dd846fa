"""The upstream connection's reading, fed by hand (its sockets are tested in
test_network.py): interim answers are skipped, reading pauses while too much body waits
unread, bytes nobody asked for end the connection, and a header that would split the request
is never written."""

from __future__ import annotations

import asyncio

import pytest

from router.config import UpstreamsConfig
from router.upstream.client import limits_of
from router.upstream.http1 import Exchange, Http1Pool, _Connection
from router.upstream.transport import BaseURL, Broken, Unreachable, Waits, tls_context

LIMITS = limits_of(UpstreamsConfig())


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.paused = False
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        self.closed = True


def connection() -> tuple[_Connection, Exchange, Transport]:
    pool = Http1Pool(BaseURL("http://node", []), LIMITS, tls_context)
    conn = _Connection(pool)
    transport = Transport()
    conn.connection_made(transport)
    exchange = Exchange(pool, conn, LIMITS)
    conn.start(exchange, b"GET / HTTP/1.1\r\nhost: node\r\n\r\n")
    return conn, exchange, transport


async def test_an_interim_answer_is_skipped() -> None:
    conn, exchange, transport = connection()
    assert transport.written.startswith(b"GET / HTTP/1.1\r\n")
    conn.data_received(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n")
    assert not exchange.head_done
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert (exchange.head_done, exchange.status) == (True, 200)
    assert exchange.headers == [(b"content-length", b"2")]
    conn.data_received(b"{}")
    assert exchange.complete and exchange.take_body() == b"{}"
    assert exchange.reusable()


async def test_reading_pauses_while_too_much_body_waits_unread() -> None:
    conn, exchange, transport = connection()
    size = 600_000
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
    conn.data_received(b"a" * 200_000)
    assert not transport.paused
    conn.data_received(b"b" * 200_000)
    assert transport.paused
    assert exchange.take_body() == b"a" * 200_000 + b"b" * 200_000
    assert not transport.paused
    conn.data_received(b"c" * 200_000)
    assert exchange.complete and not exchange.reusable()  # not until its body has been read
    assert exchange.take_body() == b"c" * 200_000
    assert exchange.reusable()


async def test_a_body_cut_by_the_connection_is_a_failure_after_what_arrived() -> None:
    conn, exchange, _ = connection()
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
    conn.connection_lost(None)
    assert exchange.take_body() == b"hello"
    assert isinstance(exchange.error, Broken) and not exchange.complete


async def test_bytes_on_an_idle_connection_close_it() -> None:
    conn, exchange, transport = connection()
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert exchange.complete and exchange.reusable()
    conn.data_received(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    assert transport.closed and conn.closed


async def test_a_header_with_a_line_break_is_refused_before_any_connection() -> None:
    pool = Http1Pool(BaseURL("http://node.invalid", []), LIMITS, tls_context)
    waits = Waits(pool_s=1, connect_s=1, write_s=1, read_s=1)
    with pytest.raises(Unreachable):
        await pool.send("GET", "/", [(b"x-request-id", b"a\r\nx-injected: 1")], None, waits)
    assert pool._open == 0  # no connection was even attempted (node.invalid does not resolve)


async def test_each_wait_times_out_after_its_own_timeout_however_the_last_was_set() -> None:
    conn, exchange, _ = connection()
    loop = asyncio.get_running_loop()
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")

    async def ended_by_data(limit_s: float) -> None:
        loop.call_soon(conn.data_received, b"2\r\nab\r\n")  # the answer moves on
        await exchange.wait(limit_s)
        assert exchange.take_body() == b"ab"

    async def timed_out(limit_s: float) -> float:
        started = loop.time()
        with pytest.raises(TimeoutError):
            await exchange.wait(limit_s)
        return loop.time() - started

    await ended_by_data(0.05)
    assert await timed_out(0.2) >= 0.19  # not cut short by the earlier wait's timer
    await ended_by_data(60)
    assert await timed_out(0.05) < 5  # not left waiting for the earlier wait's timer
    await exchange.aclose()
    assert exchange._deadline_timer is None
