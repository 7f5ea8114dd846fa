"""`push` mode (docs/protocols.md §2.3): the decode instance is chosen first, both legs at once.

The decode leg names the chosen prefill engine (its NIXL side channel, from configuration)
and the shared request id, so the decode side registers its blocks while the prefill
computes and then writes into them. If either leg fails, the other is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import AsyncExitStack, ExitStack
from typing import TypeVar

import anyio

from router.config import PushConfig
from router.selection.least_outstanding import LeastOutstanding
from router.serving import Answer, RoutedRequest
from router.throughput.legs import decode_answer, run_prefill, send_decode, whole_on_decode
from router.upstream import Reply, Upstreams
from router.upstream.vllm import NixlPrefilled, push_decode_body


class PushPath:
    """Balances decode instances, then prefill engines, by requests in flight."""

    def __init__(self, config: PushConfig, *, upstreams: Upstreams) -> None:
        self._upstreams = upstreams
        self._engines = {engine.url: engine for engine in config.prefill}
        self._prefill = LeastOutstanding(list(self._engines))
        self._decode = LeastOutstanding(config.decode)

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        decode_url = stack.enter_context(self._decode.hold(self._decode.pick()))
        if not request.splits:
            return await whole_on_decode(self._upstreams, stack, decode_url, request)
        # The prefill engine is held only while its leg runs; the callback covers a leg
        # cancelled before it started.
        prefill_hold = ExitStack()
        stack.callback(prefill_hold.close)
        prefill_url = prefill_hold.enter_context(self._prefill.hold(self._prefill.pick()))
        engine = self._engines[prefill_url]

        async def prefill() -> NixlPrefilled:
            with prefill_hold:
                return await run_prefill(self._upstreams, prefill_url, request)

        async def decode() -> Reply:
            body = push_decode_body(request.body, engine, request.request_id)
            return await send_decode(self._upstreams, stack, decode_url, request, body)

        answer, reply = await both_or_cancel(prefill(), decode())
        return decode_answer(reply, answer, request)


A = TypeVar("A")
B = TypeVar("B")


async def both_or_cancel(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Run both concurrently; the first to fail cancels the other and its error is raised."""
    a, b = asyncio.ensure_future(first), asyncio.ensure_future(second)
    try:
        done, _ = await asyncio.wait((a, b), return_when=asyncio.FIRST_EXCEPTION)
        for task in (a, b):
            if task in done and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return a.result(), b.result()
    finally:
        a.cancel()
        b.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait((a, b))
        for task in (a, b):
            if not task.cancelled():
                task.exception()  # retrieved, so a second failure is not reported as lost
