"""The upstream client on real sockets, one suite for both transports (the gateway's own
pool and httpx's): connections are reused while they can be and never when they cannot,
answers framed every way HTTP/1.1 frames them arrive whole, streams arrive line by line,
each way a connection fails keeps its error code, and an answer that sends too much is
refused by name. A request leaving in one write is the gateway's own pool's."""

from __future__ import annotations

import asyncio
import gzip
import socket
import ssl
import tracemalloc
from pathlib import Path

import pytest
import trustme

from router import __version__
from router.config import UpstreamsConfig
from router.errors import UpstreamError
from router.node import Node
from router.upstream import Upstreams
from router.upstream import tilert as node_api
from router.upstream.failures import Target
from router.upstream.http1 import Http1Transport
from router.upstream.timeouts import Timeouts
from router.upstream.transport import Transport
from tests.upstream.raw_server import (
    Handler,
    answer,
    chunked,
    read_request,
    serve_requests,
    serving,
)

TARGET = Target("probe", "the probed server")


async def test_requests_share_one_connection(transport: Transport) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(b'{"ok": true}'))

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        for _ in range(3):
            reply = await upstreams.call(TARGET, "POST", url, "/x", body={"a": 1}, read_s=5)
            assert reply.status == 200
            assert await reply.json() == {"ok": True}
        await upstreams.aclose()
    assert len(accepted) == 1


async def test_an_https_upstream_is_verified_against_the_trusted_authorities(
    transport: Transport, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_tls)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            writer.write(answer(b'{"tls": true}'))

    async with serving(handler, server_tls) as (url, accepted):
        # Unknown authority: refused before anything is sent.
        error = await failure_of_call(transport, url)
        assert (error.code, error.in_doubt) == ("probe_unreachable", False)
        # Trusted through SSL_CERT_FILE, as an operator trusts a private authority.
        ca_file = tmp_path / "ca.pem"
        authority.cert_pem.write_to_path(str(ca_file))
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        trusting = type(transport)()  # a transport reads the trusted authorities once
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=trusting)
        for _ in range(2):
            reply = await upstreams.call(TARGET, "POST", url, "/x", body={"a": 1}, read_s=5)
            assert await reply.json() == {"tls": True}
        await upstreams.aclose()
    assert len(accepted) == 1  # (the refused handshake never reached the handler) reused


async def failure_of_call(transport: Transport, url: str) -> UpstreamError:
    upstreams = Upstreams(UpstreamsConfig(), Timeouts(connect_s=5), transport=transport)
    try:
        with pytest.raises(UpstreamError) as failed:
            await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        return failed.value
    finally:
        await upstreams.aclose()


async def test_a_request_leaves_in_one_write() -> None:
    first_reads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first_reads.append(await reader.read(65536))
        writer.write(answer(b"{}"))

    async with serving(handler) as (url, _):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=Http1Transport())
        await upstreams.call(TARGET, "POST", url, "/x", body={"key": "value"}, read_s=5)
        await upstreams.aclose()
    assert first_reads[0].endswith(b'\r\n\r\n{"key":"value"}')


async def test_a_request_carries_its_upstreams_path_host_key_and_id(transport: Transport) -> None:
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                requests.append(await read_request(reader))
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(b"{}"))

    async with serving(handler) as (url, accepted):
        base = url + "/prefix"
        upstreams = Upstreams(
            UpstreamsConfig(), Timeouts(), credentials={base: "sk-1"}, transport=transport
        )
        body = {"key": "välue"}
        await upstreams.call(TARGET, "POST", base, "/x", body=body, read_s=5, request_id="r1")
        await upstreams.call(TARGET, "GET", base, "/status", read_s=5)
        await upstreams.call(TARGET, "POST", url, "/cancel", read_s=5)
        with pytest.raises(UpstreamError) as split:
            await upstreams.call(TARGET, "GET", url, "/", read_s=5, request_id="a\r\nx-evil: 1")
        await upstreams.aclose()
    # The split request was never sent; each base URL has its own pool, hence connection.
    assert split.value.code == "probe_unreachable" and len(requests) == 3 and len(accepted) == 2

    def head(request: bytes) -> tuple[bytes, dict[bytes, bytes]]:
        line, *fields = request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        pairs = [field.split(b": ", 1) for field in fields]
        assert len({name for name, _ in pairs}) == len(pairs), request  # none twice
        return line, {name.lower(): value for name, value in pairs}

    port = url.rsplit(":", 1)[1].encode()
    line, fields = head(requests[0])
    content = '{"key":"välue"}'.encode()
    assert line == b"POST /prefix/x HTTP/1.1" and requests[0].endswith(b"\r\n\r\n" + content)
    assert fields[b"host"] == b"localhost:" + port
    assert fields[b"authorization"] == b"Bearer sk-1"
    assert fields[b"x-request-id"] == b"r1"
    assert fields[b"content-type"] == b"application/json"
    assert fields[b"content-length"] == b"%d" % len(content)
    assert fields[b"accept-encoding"] == b"identity"
    assert fields[b"user-agent"] == f"pd-gateway/{__version__}".encode()
    line, fields = head(requests[1])
    assert line == b"GET /prefix/status HTTP/1.1" and b"content-length" not in fields
    assert b"x-request-id" not in fields and b"content-type" not in fields
    line, fields = head(requests[2])  # another base: no key of its own
    assert line == b"POST /cancel HTTP/1.1" and fields[b"content-length"] == b"0"
    assert b"authorization" not in fields


async def test_a_decode_stream_arrives_line_by_line(transport: Transport) -> None:
    release = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for part in (b'{"t": [1, 2]}\n{"t"', b": [3]}\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
        await release.wait()
        done = b'{"done": true, "n": 3, "finish_reason": "length"}\n'
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

    async with serving(handler) as (url, _):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        node = Node(host="127.0.0.1", http_port=int(url.rsplit(":", 1)[1]))
        body = node_api.decode_body(
            rid="r", first_token_id=1, max_tokens=3, sampling=None, timeout_s=1
        )
        stream = await node_api.open_decode(upstreams, node, body, stall_s=5)
        assert await stream.next_line() == node_api.TokenLine([1, 2])
        assert await stream.next_line() == node_api.TokenLine([3])
        release.set()
        assert await stream.next_line() == node_api.DoneLine(3, "length")
        assert await stream.next_line() is None
        await stream.aclose()
        await upstreams.aclose()


async def failure_of(
    transport: Transport, handler: Handler | None, read_s: float = 5
) -> UpstreamError:
    upstreams = Upstreams(UpstreamsConfig(), Timeouts(connect_s=1), transport=transport)
    try:
        if handler is None:  # a port nobody listens on
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            with pytest.raises(UpstreamError) as failed:
                await upstreams.call(TARGET, "GET", url, "/", read_s=read_s)
            return failed.value
        async with serving(handler) as (url, _):
            with pytest.raises(UpstreamError) as failed:
                await upstreams.call(TARGET, "GET", url, "/", read_s=read_s)
            return failed.value
    finally:
        await upstreams.aclose()


async def test_a_refused_connection_is_unreachable(transport: Transport) -> None:
    error = await failure_of(transport, None)
    assert (error.code, error.status, error.in_doubt) == ("probe_unreachable", 502, False)


async def test_a_silent_server_times_out(transport: Transport) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    error = await failure_of(transport, handler, read_s=0.05)
    assert (error.code, error.status, error.in_doubt) == ("probe_timeout", 504, True)


async def test_a_body_cut_short_is_a_broken_connection(transport: Transport) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()

    error = await failure_of(transport, handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)


async def test_every_framing_of_an_answer_arrives_whole(transport: Transport) -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += (
        b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b'{"a"', b": ", b"1}")) + b"0\r\n\r\n"
    )
    interim = b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + answer(b'{"after": "103"}')
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [chunked, interim, no_content])

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        first = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert await first.json() == {"a": 1}
        second = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert (second.status, await second.json()) == (200, {"after": "103"})
        third = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert (third.status, await third.read()) == (204, b"")
        await upstreams.aclose()
    assert len(accepted) == 1


async def test_an_answer_that_ends_with_its_connection_is_read_to_the_end(
    transport: Transport,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
        await writer.drain()
        writer.write(b"the end")
        await writer.drain()
        writer.close()

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        for _ in range(2):
            reply = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
            assert await reply.read() == b"until the end"
        await upstreams.aclose()
    assert len(accepted) == 2  # its connection could not serve again


async def test_a_connection_is_not_reused_after_connection_close_or_an_unread_body(
    transport: Transport,
) -> None:
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"
    big = answer(b"x" * 100_000)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [closing] if len(accepted) == 1 else [big, big])

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        reply = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert await reply.json() == {}
        # Closed with most of its body unread: the connection goes, not back to the pool.
        reply = await upstreams.open(TARGET, "GET", url, "/", read_s=5)
        await reply.aclose()
        reply = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert len(await reply.read()) == 100_000
        await upstreams.aclose()
    assert len(accepted) == 3


async def test_an_idle_connection_is_closed_when_it_expires() -> None:
    """The gateway's own pool closes it then (httpx's when the pool is next used)."""
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [answer(b"{}")])
        closed.set()  # the client closed its end

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(
            UpstreamsConfig(keepalive_expiry_s=0.05), Timeouts(), transport=Http1Transport()
        )
        await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        await asyncio.wait_for(closed.wait(), 5)
        await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        await upstreams.aclose()
    assert len(accepted) == 2


async def test_a_request_waits_for_a_free_connection_up_to_the_pool_timeout(
    transport: Transport,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [answer(b'{"n": 1}'), answer(b'{"n": 2}')])

    async with serving(handler) as (url, accepted):
        pools = UpstreamsConfig(max_connections=1)
        upstreams = Upstreams(pools, Timeouts(connect_s=0.1), transport=transport)
        held = await upstreams.open(TARGET, "GET", url, "/", read_s=5)
        error = await failure_of_request(upstreams, url)
        assert (error.code, error.status, error.in_doubt) == ("probe_unreachable", 502, False)
        waiting = asyncio.ensure_future(upstreams.call(TARGET, "GET", url, "/", read_s=5))
        assert await held.json() == {"n": 1}  # read to its end: the connection is free
        assert await (await waiting).json() == {"n": 2}
        await held.aclose()
        await upstreams.aclose()
    assert len(accepted) == 1


async def failure_of_request(upstreams: Upstreams, url: str) -> UpstreamError:
    with pytest.raises(UpstreamError) as failed:
        await upstreams.call(TARGET, "GET", url, "/", read_s=5)
    return failed.value


async def test_an_answer_that_is_not_http_is_a_broken_connection(transport: Transport) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await reader.read()

    error = await failure_of(transport, handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)


async def test_a_server_that_closes_without_answering_is_a_broken_connection(
    transport: Transport,
) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    error = await failure_of(transport, handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)


async def test_an_open_answer_does_not_keep_its_requests_body() -> None:
    """A stream may stay open for minutes: the gateway's own pool does not hold the prompt
    it was asked with (httpx's keeps its request)."""
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        sent.set()
        await reader.read()  # the stream stays open until the client closes it

    prompt = "x" * 2_000_000
    async with serving(handler) as (url, _):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=Http1Transport())
        tracemalloc.start()
        try:
            reply = await upstreams.open(TARGET, "POST", url, "/", body={"p": prompt}, read_s=5)
            await sent.wait()
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await reply.aclose()
        await upstreams.aclose()
    assert held < 500_000, f"{held} bytes still traced with the answer open"


async def test_a_stalled_stream_times_out_each_wait_and_loses_nothing(
    transport: Transport,
) -> None:
    resume = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b"a"))
        await writer.drain()
        await resume.wait()
        writer.write(chunked(b"b") + b"0\r\n\r\n")
        await serve_requests(reader, writer, [answer(b"{}")])

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        reply = await upstreams.open(TARGET, "GET", url, "/", read_s=5)
        assert await reply.receive(5) == b"a"
        with pytest.raises(TimeoutError):
            await reply.receive(0.05)
        resume.set()
        assert await reply.receive(5) == b"b"
        assert await reply.receive(5) == b""
        assert await reply.receive(5) == b""  # the end, to every later call
        await reply.aclose()
        assert await (await upstreams.call(TARGET, "GET", url, "/", read_s=5)).json() == {}
        await upstreams.aclose()
    assert len(accepted) == 1  # read to its end, the stream's connection served again


async def test_a_gzip_body_is_decoded(transport: Transport) -> None:
    body = gzip.compress(b'{"zipped": true}')

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [answer(body, b"content-encoding: gzip")])

    async with serving(handler) as (url, _):
        upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
        reply = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert await reply.json() == {"zipped": True}
        assert b"content-encoding" not in dict(reply.forwarded_headers())
        await upstreams.aclose()


async def test_a_body_in_a_coding_not_decoded_is_broken(transport: Transport) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(
            reader, writer, [answer(b"\x0b\x02\x80{}\x03", b"content-encoding: br")]
        )

    error = await failure_of(transport, handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)
    assert "'br'" in error.message


CAPS = UpstreamsConfig(max_header_bytes=4096, max_body_bytes=10_000)


async def capped_failure(transport: Transport, handler: Handler) -> UpstreamError:
    async with serving(handler) as (url, _):
        upstreams = Upstreams(CAPS, Timeouts(), transport=transport)
        try:
            with pytest.raises(UpstreamError) as failed:
                await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        finally:
            await upstreams.aclose()
    error = failed.value
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)
    return error


async def test_a_head_over_the_cap_is_broken(transport: Transport) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        headers = [b"x-filler-%d: %s" % (i, b"f" * 100) for i in range(50)]  # ~5.5 kB
        await serve_requests(reader, writer, [answer(b"{}", *headers)])

    error = await capped_failure(transport, handler)
    assert "max_header_bytes (4096 bytes)" in error.message


async def test_a_head_that_never_ends_is_broken_at_the_cap() -> None:
    """The gateway's own pool stops at its cap (httpx's stops at h11's own, 100 kB)."""
    sent = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(1_000_000):  # 100 MB of headers unless the client hangs up first
            writer.write(b"x-more-%d: %s\r\n" % (i, b"m" * 90))
            await writer.drain()
            sent.append(i)

    error = await capped_failure(Http1Transport(), handler)
    assert "max_header_bytes (4096 bytes)" in error.message
    assert len(sent) < 1_000_000


async def test_a_body_read_whole_over_the_cap_is_broken(transport: Transport) -> None:
    declared = answer(b"x" * 20_000)
    undeclared = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    undeclared += chunked(*[b"y" * 1000] * 20) + b"0\r\n\r\n"
    for too_long in (declared, undeclared):

        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await serve_requests(reader, writer, [too_long])  # noqa: B023

        error = await capped_failure(transport, handler)
        assert "max_body_bytes (10000 bytes)" in error.message


async def test_a_streamed_body_is_not_capped(transport: Transport) -> None:
    stream = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    stream += chunked(*[b"z" * 1000] * 20) + b"0\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [stream])

    async with serving(handler) as (url, _):
        upstreams = Upstreams(CAPS, Timeouts(), transport=transport)
        reply = await upstreams.open(TARGET, "GET", url, "/", read_s=5)
        received = b"".join([chunk async for chunk in reply.chunks()])
        await reply.aclose()
        await upstreams.aclose()
    assert received == b"z" * 20_000
