"""`Reply.receive` over httpx's transport (its body read by a task): a failure, like the
end, is seen by every later call, so no reader is left waiting after it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from router.config import UpstreamsConfig
from router.errors import UpstreamError
from router.upstream import Upstreams
from router.upstream.failures import Target
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts

TARGET = Target("probe", "the probed server")


class Broken(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"part"
        raise httpx.ReadError("connection reset")


class Whole(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"all"


async def receive_all(stream: httpx.AsyncByteStream) -> tuple[list[bytes], list[BaseException]]:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=stream)

    upstreams = Upstreams(
        UpstreamsConfig(), Timeouts(), transport=HttpxTransport(httpx.MockTransport(handler))
    )
    reply = await upstreams.open(TARGET, "GET", "http://upstream", "/", read_s=5)
    received, failures = [], []
    try:
        for _ in range(3):
            try:
                received.append(await asyncio.wait_for(reply.receive(5), timeout=2))
            except UpstreamError as exc:
                failures.append(exc)
    finally:
        await reply.aclose()
        await upstreams.aclose()
    return received, failures


async def test_a_failure_is_raised_to_every_later_call() -> None:
    received, failures = await receive_all(Broken())
    assert received == [b"part"]
    assert len(failures) == 2
    assert all(f.code == TARGET.code("broken") for f in failures)


async def test_the_end_is_returned_to_every_later_call() -> None:
    received, failures = await receive_all(Whole())
    assert (received, failures) == ([b"all", b"", b""], [])


async def test_a_wait_that_times_out_loses_nothing() -> None:
    release = asyncio.Event()

    class Late(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            await release.wait()
            yield b"late"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Late())

    upstreams = Upstreams(
        UpstreamsConfig(), Timeouts(), transport=HttpxTransport(httpx.MockTransport(handler))
    )
    reply = await upstreams.open(TARGET, "GET", "http://upstream", "/", read_s=5)
    with pytest.raises(TimeoutError):
        await reply.receive(0.01)
    release.set()
    assert await reply.receive(5) == b"late"
    assert await reply.receive(5) == b""
    await reply.aclose()
    await upstreams.aclose()
