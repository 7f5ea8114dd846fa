"""Upstreams that answer with hostile bytes, on real sockets, against each transport (the
gateway's own pool and httpx's): nothing after an answer's end is read as part of it (and
its connection is not reused), a 101 or a storm of interim answers is a broken answer,
header fields are capped in number, and every answer that is not a stream ends by its
deadline however slowly it trickles in, while a stream is cut only when its lines stop
coming. Where httpx's pool holds to a rule in its own way, the test says how."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import pytest

from router.config import UpstreamsConfig
from router.errors import DecodeError, UpstreamError
from router.node import Node
from router.throughput.legs import send_decode
from router.upstream import Upstreams, httpx_transport
from router.upstream import tilert as node_api
from router.upstream.failures import Target
from router.upstream.http1 import Http1Transport
from router.upstream.timeouts import Timeouts
from router.upstream.transport import Transport
from tests.throughput.support import routed
from tests.upstream.raw_server import answer, read_request, serve_requests, serving

TARGET = Target("probe", "the probed server")
Writer = asyncio.StreamWriter
Reader = asyncio.StreamReader


def upstreams(transport: Transport, **pools: int) -> Upstreams:
    return Upstreams(UpstreamsConfig(**pools), Timeouts(), transport=transport)


@pytest.mark.parametrize(
    ("first", "status", "body"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", 200, b"{}"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", 204, b""),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 200, b"{}"),
    ],
)
@pytest.mark.parametrize(
    "after",
    [
        b"HTTP/1.1 500 Smuggled\r\ncontent-length: 5\r\n\r\nevil!",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nevil!",
        b"not http at all",
    ],
)
async def test_bytes_after_an_answer_are_never_part_of_it_and_close_its_connection(
    transport: Transport, first: bytes, status: int, body: bytes, after: bytes
) -> None:
    async def handler(reader: Reader, writer: Writer) -> None:
        # In one write: the client reads both in one network read.
        await serve_requests(reader, writer, [first + after, answer(b'{"next": 1}')])

    async with serving(handler) as (url, accepted):
        client = upstreams(transport)
        reply = await client.call(TARGET, "GET", url, "/", read_s=5)
        assert (reply.status, reply.content) == (status, body)
        # The next call does not get the smuggled answer: a new connection serves it.
        reply = await client.call(TARGET, "GET", url, "/", read_s=5)
        assert (reply.status, reply.content) == (status, body)
        await client.aclose()
    assert len(accepted) == 2


async def test_httpx_never_reuses_a_connection_it_cannot_look_into(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another httpcore whose connection cannot be reached: no telling what follows the
    answer, so its connection is closed."""
    monkeypatch.setattr(httpx_transport, "_unread_after_end", lambda _: None)

    async def handler(reader: Reader, writer: Writer) -> None:
        await serve_requests(reader, writer, [answer(b"{}"), answer(b"{}")])

    async with serving(handler) as (url, accepted):
        client = upstreams(httpx_transport.HttpxTransport())
        for _ in range(2):
            reply = await client.call(TARGET, "GET", url, "/", read_s=5)
            assert (reply.status, reply.content) == (200, b"{}")
        await client.aclose()
    assert len(accepted) == 2


def own(transport: Transport) -> bool:
    """The gateway's own pool, not httpx's."""
    return isinstance(transport, Http1Transport)


async def failure(
    transport: Transport,
    handler: Callable[[Reader, Writer], Awaitable[None]],
    read_s: float = 5,
    **pools: int,
) -> UpstreamError:
    async with serving(handler) as (url, _):
        client = upstreams(transport, **pools)
        try:
            with pytest.raises(UpstreamError) as failed:
                await client.call(TARGET, "GET", url, "/", read_s=read_s)
        finally:
            await client.aclose()
    return failed.value


async def test_an_upgrade_is_a_broken_answer_without_a_traceback(transport: Transport) -> None:
    loop_errors: list[dict[str, object]] = []  # what reaches the loop's exception handler
    asyncio.get_running_loop().set_exception_handler(lambda _, context: loop_errors.append(context))

    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n"
            b"connection: upgrade\r\n\r\n\x81\x05hello"
        )
        await reader.read()

    error = await failure(transport, handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)
    assert ("101" if own(transport) else "_SWITCH_UPGRADE") in error.message
    assert loop_errors == []


async def test_endless_interim_answers_are_a_broken_answer(transport: Transport) -> None:
    """httpx's pool skips interim answers however many come: the call ends by its read
    timeout instead."""

    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        for _ in range(100):
            writer.write(b"HTTP/1.1 102 Processing\r\n\r\n")
        await reader.read()

    error = await failure(transport, handler, read_s=0.5)
    if own(transport):
        assert error.code == "probe_failed" and "interim (1xx) answers" in error.message
    else:
        assert error.code == "probe_timeout"


@pytest.mark.parametrize("fields", [100, 200_000])
async def test_header_fields_over_the_cap_are_a_broken_answer(
    transport: Transport, fields: int
) -> None:
    """Past h11's own bound on a head (16 KiB), httpx's pool refuses it before counting."""

    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"a:\r\n" * fields + b"content-length: 2\r\n\r\n{}")
        await reader.read()

    error = await failure(transport, handler, max_header_count=64)
    counted = own(transport) or fields == 100
    reason = "max_header_count (64 fields)" if counted else "Receive buffer too long"
    assert error.code == "probe_failed" and reason in error.message


async def trickle(writer: Writer, data: bytes, every_s: float = 0.05) -> None:
    """One byte at a time: each well within any read timeout of these tests."""
    for byte in data:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(every_s)


@pytest.mark.parametrize("where", ["head", "body"])
async def test_a_trickling_answer_ends_by_its_deadline(transport: Transport, where: str) -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n" + b"x-pad: p\r\n" * 100 + b"\r\n"

    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        if where == "head":
            await trickle(writer, head)
        else:
            writer.write(head)
            await trickle(writer, b"x" * 1000)

    async with serving(handler) as (url, _):
        client = upstreams(transport)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UpstreamError) as failed:
            await client.call(TARGET, "GET", url, "/", read_s=0.5, total_s=1.0)
        took = loop.time() - started
        await client.aclose()
    assert (failed.value.code, failed.value.status, failed.value.in_doubt) == (
        "probe_timeout",
        504,
        True,
    )
    assert took < 3.0  # the trickle would take over 50 s


async def test_a_non_streamed_throughput_answer_has_a_deadline(transport: Transport) -> None:
    """A silent upstream: the native path's non-stream call ends at `prefill_s`."""

    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
        )
        await trickle(writer, b" " * 100, every_s=0.1)

    async with serving(handler) as (url, _):
        client = Upstreams(UpstreamsConfig(), Timeouts(prefill_s=0.5), transport=transport)
        async with AsyncExitStack() as stack:
            request = routed({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            with pytest.raises(UpstreamError) as failed:
                await send_decode(client, stack, url, request, request.native_body)
        await client.aclose()
    assert failed.value.status == 504 and "no whole answer within 0.5 s" in failed.value.message


async def test_a_node_stream_trickling_without_a_line_stalls(transport: Transport) -> None:
    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        writer.write(b'e\r\n{"t": [1, 2]}\n\r\n')
        for _ in range(200):  # a line that never ends, a byte every 50 ms
            writer.write(b"1\r\n \r\n")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with serving(handler) as (url, _):
        client = upstreams(transport)
        node = Node(host="127.0.0.1", http_port=int(url.rsplit(":", 1)[1]))
        body = node_api.decode_body(
            rid="r", first_token_id=1, max_tokens=3, sampling=None, timeout_s=1
        )
        stream = await node_api.open_decode(client, node, body, stall_s=0.5)
        assert await stream.next_line() == node_api.TokenLine([1, 2])
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(DecodeError) as stalled:
            await stream.next_line()
        assert stalled.value.code == "decode_stalled"
        assert loop.time() - started < 2.0
        await stream.aclose()
        await client.aclose()


async def test_a_stream_is_cut_only_when_its_lines_stop(transport: Transport) -> None:
    """Lines every 0.2 s for longer than any one wait may last go through whole; then bytes
    without a line's end are cut."""
    events = [b"data: %d\n\n" % i for i in range(8)]

    async def handler(reader: Reader, writer: Writer) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        for event in events:
            writer.write(event)
            await writer.drain()
            await asyncio.sleep(0.2)
        await trickle(writer, b"x" * 200)

    async with serving(handler) as (url, _):
        client = upstreams(transport)
        reply = await client.open(TARGET, "GET", url, "/", read_s=0.5)
        received = b""
        with pytest.raises(UpstreamError) as cut:
            async for chunk in reply.chunks(by_lines=True):
                received += chunk
        await reply.aclose()
        await client.aclose()
    assert received.startswith(b"".join(events))
    assert cut.value.code == "probe_timeout" and "no line's end" in cut.value.message
