"""The node's decode stream as the gateway reads it: a stall or a cancelled reader never
kills the stream (it can still be read to its end), and malformed lines are node errors;
each on a real socket through the connection pool and through another transport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from router.config import UpstreamsConfig
from router.errors import DecodeError
from router.node import Node
from router.upstream import Upstreams
from router.upstream import tilert as node_api
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts

NODE = Node(host="node", http_port=5557)
Opener = Callable[
    [list[bytes], dict[int, asyncio.Event], float],
    Awaitable[tuple[Upstreams, node_api.DecodeStream]],
]


class Lines(httpx.AsyncByteStream):
    """An ndjson body whose lines the test releases one gate at a time."""

    def __init__(self, lines: list[bytes], gates: dict[int, asyncio.Event]) -> None:
        self._lines = lines
        self._gates = gates

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i, line in enumerate(self._lines):
            if i in self._gates:
                await self._gates[i].wait()
            yield line + b"\n"


@pytest.fixture(params=["network", "mock"])
def network(request: pytest.FixtureRequest) -> bool:
    """On a loopback socket through the connection pool, or through another transport."""
    return request.param == "network"


@pytest.fixture
async def open_stream(network: bool) -> AsyncIterator[Opener]:
    """Opens a decode stream whose body is `lines`, line `i` sent once `gates[i]` is set."""
    servers: list[asyncio.Server] = []
    writers: list[asyncio.StreamWriter] = []
    upstreams: list[Upstreams] = []
    streams: list[node_api.DecodeStream] = []

    async def open_(lines: list[bytes], gates: dict[int, asyncio.Event], stall_s: float):
        body = node_api.decode_body(
            rid="r", first_token_id=1, max_tokens=8, sampling=None, timeout_s=1
        )
        node = NODE
        if network:
            server = await asyncio.start_server(
                _answering(Lines(lines, gates), writers), "127.0.0.1", 0
            )
            servers.append(server)
            node = Node(host="127.0.0.1", http_port=server.sockets[0].getsockname()[1])
            http = Upstreams(UpstreamsConfig(), Timeouts())
        else:

            def handler(request: httpx.Request) -> httpx.Response:
                return httpx.Response(200, stream=Lines(lines, gates))

            http = Upstreams(
                UpstreamsConfig(),
                Timeouts(),
                transport=HttpxTransport(httpx.MockTransport(handler)),
            )
        upstreams.append(http)
        streams.append(await node_api.open_decode(http, node, body, stall_s=stall_s))
        return http, streams[-1]

    yield open_
    for stream in streams:
        await stream.aclose()
    for http in upstreams:
        await http.aclose()
    for writer in writers:
        writer.close()
    for server in servers:
        server.close()
        await server.wait_closed()


def _answering(body: Lines, writers: list[asyncio.StreamWriter]):
    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        async for line in body:
            writer.write(b"%x\r\n%s\r\n" % (len(line), line))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    return on_connection


DONE = b'{"done": true, "n": 3, "seq_len": 9, "finish_reason": "stop", "timing_ms": {}}'


async def test_a_stall_does_not_kill_the_stream(open_stream: Opener) -> None:
    release = asyncio.Event()
    http, stream = await open_stream([b'{"t": [1, 2]}', b'{"t": [3]}', DONE], {1: release}, 0.05)
    assert await stream.next_line() == node_api.TokenLine([1, 2])
    with pytest.raises(DecodeError) as stalled:
        await stream.next_line()
    assert stalled.value.code == "decode_stalled"
    release.set()
    assert await stream.next_line() == node_api.TokenLine([3])
    assert await stream.next_line() == node_api.DoneLine(3, "stop")
    assert await stream.next_line() is None
    await http.aclose()


async def test_a_cancelled_reader_leaves_the_rest_for_drain(open_stream: Opener) -> None:
    release = asyncio.Event()
    http, stream = await open_stream([b'{"t": [1]}', b'{"t": [2]}', DONE], {1: release}, 5)
    await stream.next_line()
    reader = asyncio.create_task(stream.next_line())
    await asyncio.sleep(0)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    release.set()
    assert await node_api.drain(stream, limit_s=5) is True
    assert stream.done_read and stream.body_ended
    await http.aclose()


async def test_drain_reports_a_node_that_never_ends(open_stream: Opener) -> None:
    never = asyncio.Event()
    http, stream = await open_stream([b'{"t": [1]}', DONE], {1: never}, 0.05)
    assert await node_api.drain(stream, limit_s=1) is False
    await http.aclose()


@pytest.mark.parametrize(
    "line",
    [
        b"null",
        b"[1, 2]",
        b'"text"',
        b'{"t": 5}',
        b'{"t": ["a"]}',
        b'{"done": true, "n": "x"}',
        b"{not json",
    ],
)
async def test_malformed_lines_are_node_errors(open_stream: Opener, line: bytes) -> None:
    http, stream = await open_stream([line, DONE], {}, 5)
    with pytest.raises(DecodeError) as bad:
        await stream.next_line()
    assert bad.value.code == "decode_bad_line"
    await http.aclose()


async def test_an_error_line_is_a_decode_failure(open_stream: Opener) -> None:
    http, stream = await open_stream([b'{"t": [1]}', b'{"error": "decode stalled"}'], {}, 5)
    await stream.next_line()
    with pytest.raises(DecodeError, match="decode stalled") as failed:
        await stream.next_line()
    assert failed.value.code == "decode_failed"
    assert await node_api.drain(stream, limit_s=5) is True  # the body did end
    await http.aclose()


async def test_two_readers_at_once_each_get_a_line_and_neither_is_left_waiting(
    open_stream: Opener,
) -> None:
    """A drain may start while a relay that is being stopped still waits for a line."""
    release = asyncio.Event()
    _, stream = await open_stream([b'{"t": [1]}', b'{"t": [2]}', DONE], {0: release}, 5)
    first = asyncio.ensure_future(stream.next_line())
    second = asyncio.ensure_future(stream.next_line())
    await asyncio.sleep(0)
    release.set()
    lines = await asyncio.wait_for(asyncio.gather(first, second), timeout=3)
    assert sorted(line.ids for line in lines) == [[1], [2]]
    assert await node_api.drain(stream, limit_s=5) is True


class ScriptedReply:
    """A reply whose body arrives in the given network reads, then ends."""

    def __init__(self, reads: list[bytes]) -> None:
        self._reads = list(reads)

    async def receive(self, timeout_s: float | None) -> bytes:
        return self._reads.pop(0) if self._reads else b""

    async def aclose(self) -> None:
        pass


async def test_a_line_over_the_cap_is_refused_and_not_kept_while_it_grows() -> None:
    """A node that never ends its line costs at most the cap; the stream stays drainable."""
    reads = [b'{"t": [1]}\n{"t": [', *[b"9, " * 20] * 50, b"2]}\n", DONE + b"\n"]
    stream = node_api.DecodeStream(ScriptedReply(reads), stall_s=5, max_line_bytes=256)  # type: ignore[arg-type]
    assert await stream.next_line() == node_api.TokenLine([1])
    with pytest.raises(DecodeError, match="over 256 bytes") as bad:
        await stream.next_line()
    assert bad.value.code == "decode_bad_line"
    assert stream._partial == []
    assert await stream.next_line() == node_api.DoneLine(3, "stop")  # the rest of it dropped
    assert await stream.next_line() is None


async def test_a_whole_line_over_the_cap_is_refused() -> None:
    reads = [b'{"t": [' + b"7, " * 200 + b"7]}\n" + DONE + b"\n"]
    stream = node_api.DecodeStream(ScriptedReply(reads), stall_s=5, max_line_bytes=256)  # type: ignore[arg-type]
    with pytest.raises(DecodeError, match="over 256 bytes"):
        await stream.next_line()
    assert await stream.next_line() == node_api.DoneLine(3, "stop")
