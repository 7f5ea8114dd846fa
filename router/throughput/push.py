"""`push` mode (PROTOCOLS.md §2.3): the decode instance is chosen first and both legs run at once.

The decode leg names the chosen prefill engine (its NIXL side channel, from configuration)
and the shared request id, so the decode side registers its blocks while the prefill
computes and then writes into them. If either leg fails, the other is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import AsyncExitStack, ExitStack
from typing import Any, TypeVar

import anyio
import httpx

from router.balance import LeastOutstanding
from router.config import PushConfig, TimeoutsConfig
from router.throughput.legs import (
    PrefillAnswer,
    decode_answer,
    decode_leg,
    prefill_leg,
    push_decode_body,
    run_prefill,
)
from router.throughput.relay import RelayedPath
from router.throughput.upstream import Reply, Upstream, send_leg, status_failure


class PushPath(RelayedPath):
    """Balances decode instances, then prefill engines, by requests in flight."""

    def __init__(
        self, config: PushConfig, *, http: httpx.AsyncClient, timeouts: TimeoutsConfig
    ) -> None:
        self._http = http
        self._timeouts = timeouts
        self._engines = {engine.url: engine for engine in config.prefill}
        self._prefill = LeastOutstanding(list(self._engines))
        self._decode = LeastOutstanding(config.decode)

    async def _open(
        self, body: dict[str, Any], path: str, request_id: str, stack: AsyncExitStack
    ) -> Upstream:
        decode_url = stack.enter_context(self._decode.hold(self._decode.pick()))
        # The prefill engine is held only while its leg runs; the callback covers a leg
        # cancelled before it started.
        prefill_hold = ExitStack()
        stack.callback(prefill_hold.close)
        prefill_url = prefill_hold.enter_context(self._prefill.hold(self._prefill.pick()))
        engine = self._engines[prefill_url]

        p_leg = prefill_leg(prefill_url, path, request_id, self._timeouts)
        d_leg = decode_leg(decode_url, path, request_id, self._timeouts, body=body)

        async def prefill() -> PrefillAnswer:
            with prefill_hold:
                return await run_prefill(self._http, p_leg, body)

        async def decode() -> Reply:
            reply = await send_leg(
                self._http, d_leg, push_decode_body(body, engine, request_id), stack
            )
            if reply.status != 200:
                raise status_failure(reply)
            return reply

        answer, reply = await both_or_cancel(prefill(), decode())
        return decode_answer(reply, answer)

    def outstanding(self) -> dict[str, dict[str, int]]:
        """Requests in flight per prefill and per decode URL."""
        return {"prefill": self._prefill.outstanding(), "decode": self._decode.outstanding()}


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
