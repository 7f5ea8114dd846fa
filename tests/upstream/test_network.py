"""The upstream client on real sockets: connections are reused while they can be and never
when they cannot, a request leaves in one write, answers framed every way HTTP/1.1 frames
them arrive whole, streams arrive line by line, and each way a connection fails keeps its
error code."""

from __future__ import annotations

import asyncio
import socket
import ssl
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trustme

from router.config import TimeoutsConfig, UpstreamsConfig
from router.errors import UpstreamError
from router.node import Node
from router.upstream import Upstreams
from router.upstream import tilert as node_api
from router.upstream.failures import Target

TARGET = Target("probe", "the probed server")
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def serving(
    handler: Handler, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[str, list[int]]]:
    """A loopback server running `handler` per connection (over TLS with `tls`); yields its
    URL and a list that gets one entry per connection accepted."""
    accepted: list[int] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"{'https' if tls else 'http'}://localhost:{port}", accepted
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return head + await reader.readexactly(length)


def answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def test_requests_share_one_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer(b'{"ok": true}'))

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
        for _ in range(3):
            reply = await upstreams.call(TARGET, "POST", url, "/x", body={"a": 1}, read_s=5)
            assert reply.status == 200
            assert await reply.json() == {"ok": True}
        await upstreams.aclose()
    assert len(accepted) == 1


async def test_an_https_upstream_is_verified_against_the_trusted_authorities(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
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
        error = await failure_of_call(url)
        assert (error.code, error.in_doubt) == ("probe_unreachable", False)
        # Trusted through SSL_CERT_FILE, as an operator trusts a private authority.
        ca_file = tmp_path / "ca.pem"
        authority.cert_pem.write_to_path(str(ca_file))
        monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
        for _ in range(2):
            reply = await upstreams.call(TARGET, "POST", url, "/x", body={"a": 1}, read_s=5)
            assert await reply.json() == {"tls": True}
        await upstreams.aclose()
    assert len(accepted) == 1  # (the refused handshake never reached the handler) reused


async def failure_of_call(url: str) -> UpstreamError:
    upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig(connect_s=5))
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
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
        await upstreams.call(TARGET, "POST", url, "/x", body={"key": "value"}, read_s=5)
        await upstreams.aclose()
    assert first_reads[0].endswith(b'\r\n\r\n{"key":"value"}')


async def test_a_request_carries_its_upstreams_path_host_key_and_id() -> None:
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
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig(), credentials={base: "sk-1"})
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
    line, fields = head(requests[1])
    assert line == b"GET /prefix/status HTTP/1.1" and b"content-length" not in fields
    assert b"x-request-id" not in fields and b"content-type" not in fields
    line, fields = head(requests[2])  # another base: no key of its own
    assert line == b"POST /cancel HTTP/1.1" and fields[b"content-length"] == b"0"
    assert b"authorization" not in fields


async def test_a_decode_stream_arrives_line_by_line() -> None:
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
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
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


async def failure_of(handler: Handler | None, read_s: float = 5) -> UpstreamError:
    upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig(connect_s=1))
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


async def test_a_refused_connection_is_unreachable() -> None:
    error = await failure_of(None)
    assert (error.code, error.status, error.in_doubt) == ("probe_unreachable", 502, False)


async def test_a_silent_server_times_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    error = await failure_of(handler, read_s=0.05)
    assert (error.code, error.status, error.in_doubt) == ("probe_timeout", 504, True)


async def test_a_body_cut_short_is_a_broken_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{")
        await writer.drain()

    error = await failure_of(handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)


async def serve_requests(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answers: list[bytes]
) -> None:
    """Answers each request on one connection with the next of `answers`."""
    for reply in answers:
        try:
            await read_request(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        writer.write(reply)
        await writer.drain()
    await reader.read()  # until the client closes


async def test_every_framing_of_an_answer_arrives_whole() -> None:
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    chunked += (
        b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b'{"a"', b": ", b"1}")) + b"0\r\n\r\n"
    )
    interim = b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + answer(b'{"after": "103"}')
    no_content = b"HTTP/1.1 204 No Content\r\n\r\n"

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [chunked, interim, no_content])

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
        first = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert await first.json() == {"a": 1}
        second = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert (second.status, await second.json()) == (200, {"after": "103"})
        third = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        assert (third.status, await third.read()) == (204, b"")
        await upstreams.aclose()
    assert len(accepted) == 1


async def test_an_answer_that_ends_with_its_connection_is_read_to_the_end() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
        await writer.drain()
        writer.write(b"the end")
        await writer.drain()
        writer.close()

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
        for _ in range(2):
            reply = await upstreams.call(TARGET, "GET", url, "/", read_s=5)
            assert await reply.read() == b"until the end"
        await upstreams.aclose()
    assert len(accepted) == 2  # its connection could not serve again


async def test_a_connection_is_not_reused_after_connection_close_or_an_unread_body() -> None:
    closing = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"
    big = answer(b"x" * 100_000)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [closing] if len(accepted) == 1 else [big, big])

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
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
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [answer(b"{}")])
        closed.set()  # the client closed its end

    async with serving(handler) as (url, accepted):
        upstreams = Upstreams(UpstreamsConfig(keepalive_expiry_s=0.05), TimeoutsConfig())
        await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        await asyncio.wait_for(closed.wait(), 5)
        await upstreams.call(TARGET, "GET", url, "/", read_s=5)
        await upstreams.aclose()
    assert len(accepted) == 2


async def test_a_request_waits_for_a_free_connection_up_to_the_pool_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_requests(reader, writer, [answer(b'{"n": 1}'), answer(b'{"n": 2}')])

    async with serving(handler) as (url, accepted):
        pools = UpstreamsConfig(max_connections=1)
        upstreams = Upstreams(pools, TimeoutsConfig(connect_s=0.1))
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


async def test_an_answer_that_is_not_http_is_a_broken_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        await reader.read()

    error = await failure_of(handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)


async def test_a_server_that_closes_without_answering_is_a_broken_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    error = await failure_of(handler)
    assert (error.code, error.status, error.in_doubt) == ("probe_failed", 502, True)


async def test_an_open_answer_does_not_keep_its_requests_body() -> None:
    """A stream may stay open for minutes: the prompt it was asked with is not held."""
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        sent.set()
        await reader.read()  # the stream stays open until the client closes it

    prompt = "x" * 2_000_000
    async with serving(handler) as (url, _):
        upstreams = Upstreams(UpstreamsConfig(), TimeoutsConfig())
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
