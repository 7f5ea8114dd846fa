"""The node's decode stream as the gateway reads it: a stall or a cancelled reader never
kills the stream (it can still be read to its end), and malformed lines are node errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from router.config import NodeConfig, TimeoutsConfig, UpstreamsConfig
from router.errors import DecodeError
from router.upstream import Upstreams
from router.upstream import tilert as node_api

NODE = NodeConfig(host="node", http_port=5557)


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


async def open_stream(lines: list[bytes], gates: dict[int, asyncio.Event], stall_s: float):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Lines(lines, gates))

    http = Upstreams(UpstreamsConfig(), TimeoutsConfig(), transport=httpx.MockTransport(handler))
    body = node_api.decode_body(rid="r", first_token_id=1, max_tokens=8, sampling=None, timeout_s=1)
    return http, await node_api.open_decode(http, NODE, body, stall_s=stall_s)


DONE = b'{"done": true, "n": 3, "seq_len": 9, "finish_reason": "stop", "timing_ms": {}}'


async def test_a_stall_does_not_kill_the_stream() -> None:
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


async def test_a_cancelled_reader_leaves_the_rest_for_drain() -> None:
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
    assert stream.ended and stream.eof
    await http.aclose()


async def test_drain_reports_a_node_that_never_ends() -> None:
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
async def test_malformed_lines_are_node_errors(line: bytes) -> None:
    http, stream = await open_stream([line, DONE], {}, 5)
    with pytest.raises(DecodeError) as bad:
        await stream.next_line()
    assert bad.value.code == "decode_bad_line"
    await http.aclose()


async def test_an_error_line_is_a_decode_failure() -> None:
    http, stream = await open_stream([b'{"t": [1]}', b'{"error": "decode stalled"}'], {}, 5)
    await stream.next_line()
    with pytest.raises(DecodeError, match="decode stalled") as failed:
        await stream.next_line()
    assert failed.value.code == "decode_failed"
    assert await node_api.drain(stream, limit_s=5) is True  # the body did end
    await http.aclose()
