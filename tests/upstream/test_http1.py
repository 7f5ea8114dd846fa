"""The upstream connection's reading, fed by hand (its sockets are tested in
test_network.py): interim answers are skipped, reading pauses while too much body waits
unread, bytes nobody asked for end the connection, and a header that would split the request
is never written."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from router.upstream.http1 import Http1Pool, _Connection


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


def connection() -> tuple[_Connection, Transport]:
    pool = Http1Pool(httpx.Limits())
    conn = _Connection(pool, (b"http", b"node", 80))
    transport = Transport()
    conn.connection_made(transport)
    conn.start(b"GET / HTTP/1.1\r\nhost: node\r\n\r\n")
    return conn, transport


async def test_an_interim_answer_is_skipped() -> None:
    conn, transport = connection()
    assert transport.written.startswith(b"GET / HTTP/1.1\r\n")
    conn.data_received(b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>\r\n\r\n")
    assert not conn.head_done
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert (conn.head_done, conn.status, conn.headers) == (True, 200, [(b"content-length", b"2")])
    conn.data_received(b"{}")
    assert conn.complete and conn.take_body() == b"{}"
    assert conn.reusable()


async def test_reading_pauses_while_too_much_body_waits_unread() -> None:
    conn, transport = connection()
    size = 600_000
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
    conn.data_received(b"a" * 200_000)
    assert not transport.paused
    conn.data_received(b"b" * 200_000)
    assert transport.paused
    assert conn.take_body() == b"a" * 200_000 + b"b" * 200_000
    assert not transport.paused
    conn.data_received(b"c" * 200_000)
    assert conn.complete and not conn.reusable()  # not until its body has been read
    assert conn.take_body() == b"c" * 200_000
    assert conn.reusable()


async def test_a_body_cut_by_the_connection_is_a_failure_after_what_arrived() -> None:
    conn, _ = connection()
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
    conn.connection_lost(None)
    assert conn.take_body() == b"hello"
    assert isinstance(conn.error, httpx.RemoteProtocolError) and not conn.complete


async def test_bytes_on_an_idle_connection_close_it() -> None:
    conn, transport = connection()
    conn.data_received(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
    assert conn.complete and conn.reusable()
    conn.data_received(b"HTTP/1.1 408 Request Timeout\r\n\r\n")
    assert transport.closed and not conn.reusable()


async def test_a_header_with_a_line_break_is_refused_before_any_connection() -> None:
    pool = Http1Pool(httpx.Limits())
    request = httpx.Request(
        "GET", "http://node.invalid/", headers={"x-request-id": "a\r\nx-injected: 1"}
    )
    with pytest.raises(httpx.LocalProtocolError):
        await pool.handle_async_request(request)
    assert pool._open == 0  # no connection was even attempted (node.invalid does not resolve)


async def test_each_wait_times_out_after_its_own_timeout_however_the_last_was_set() -> None:
    conn, _ = connection()
    loop = asyncio.get_running_loop()
    conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")

    async def ended_by_data(limit_s: float) -> None:
        loop.call_soon(conn.data_received, b"2\r\nab\r\n")  # the answer moves on
        await conn.wait(limit_s)
        assert conn.take_body() == b"ab"

    async def timed_out(limit_s: float) -> float:
        started = loop.time()
        with pytest.raises(TimeoutError):
            await conn.wait(limit_s)
        return loop.time() - started

    await ended_by_data(0.05)
    assert await timed_out(0.2) >= 0.19  # not cut short by the earlier wait's timer
    await ended_by_data(60)
    assert await timed_out(0.05) < 5  # not left waiting for the earlier wait's timer
    conn.close()
    assert conn.deadline_timer is None
