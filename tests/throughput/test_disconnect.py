"""A client that goes away aborts the upstream legs, in every mode, over a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from router.config import PrefillEngineConfig, ProxyConfig, PullConfig, PushConfig
from router.serving import ServePath
from router.throughput import make_throughput_path

from .support import Upstreams, answer, app_for, in_flight, serving, sse, wait_until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
PREFILL_ANSWER = {
    "choices": [{"index": 0, "message": {"content": "x"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3},
    "kv_transfer_params": {"remote_engine_id": "p"},
}
CONFIGS = {
    "proxy": ProxyConfig(mode="proxy", urls=["http://d:8000"]),
    "pull": PullConfig(mode="pull", prefill=["http://p:8000"], decode=["http://d:8000"]),
    "push": PushConfig(
        mode="push",
        prefill=[
            PrefillEngineConfig(
                url="http://p:8000", engine_id="e", side_channel_host="h", side_channel_port=1
            )
        ],
        decode=["http://d:8000"],
    ),
}


def build(mode: str, up: Upstreams) -> ServePath:
    return make_throughput_path(CONFIGS[mode], upstreams=up.pool())


@pytest.mark.parametrize("mode", sorted(CONFIGS))
async def test_disconnect_mid_stream_closes_the_upstream_stream(mode: str) -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            yield sse({"choices": [{"delta": {"content": "a"}}]})
            await asyncio.Event().wait()
            yield b"never"
        finally:
            closed.set()

    async def decode(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless(), headers={"content-type": "text/event-stream"})

    up = Upstreams()
    up.on("p", answer(PREFILL_ANSWER))
    up.on("d", decode)
    path = build(mode, up)
    async with serving(app_for(path)) as url, httpx.AsyncClient(base_url=url) as client:
        async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
            assert response.status_code == 200
            first = await anext(response.aiter_raw())
            assert first.startswith(b"data: ")
        await asyncio.wait_for(closed.wait(), timeout=5)
        await wait_until(lambda: in_flight(path) == 0, what="balancer holds released")


@pytest.mark.parametrize("mode", sorted(CONFIGS))
async def test_disconnect_before_any_answer_cancels_every_pending_leg(mode: str) -> None:
    started: dict[str, asyncio.Event] = {"p": asyncio.Event(), "d": asyncio.Event()}
    cancelled: dict[str, asyncio.Event] = {"p": asyncio.Event(), "d": asyncio.Event()}

    async def hang(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        started[host].set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled[host].set()
            raise
        raise AssertionError("unreachable")

    up = Upstreams()
    up.on("p", hang)
    up.on("d", hang)
    path = build(mode, up)
    # Proxy has only the one leg; pull sends the decode leg after the prefill; push both.
    pending = {"proxy": ["d"], "pull": ["p"], "push": ["p", "d"]}[mode]
    async with serving(app_for(path)) as url, httpx.AsyncClient(base_url=url) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
        for host in pending:
            await asyncio.wait_for(started[host].wait(), timeout=5)
        request.cancel()
        for host in pending:
            await asyncio.wait_for(cancelled[host].wait(), timeout=5)
        await wait_until(lambda: in_flight(path) == 0, what="balancer holds released")
    assert sorted({s.host for s in up.seen}) == sorted(pending)
