"""`push` mode (docs/protocols.md §2.3): the decode instance is chosen first, both legs at once.

The decode leg names the chosen prefill engine (its NIXL side channel, from configuration)
and the shared request id, so the decode side registers its blocks while the prefill
computes and then writes into them. If either leg fails, the other is cancelled. Neither
leg is sent again elsewhere: they are bound to each other (the decode leg names the prefill
engine) and start together, so a failed leg leaves the other in doubt; each outcome still
counts towards its server's health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from contextlib import AsyncExitStack, ExitStack
from typing import TypeVar

import anyio

from router.errors import UpstreamError
from router.selection import Choice, PathSelection, ServerSet, call_on, outcome_of
from router.serving import Answer, RoutedRequest
from router.throughput.legs import (
    NativeDeps,
    SplitPath,
    WholeWhen,
    chosen,
    decode_answer,
    planned_servers,
    run_prefill,
    send_decode,
    whole_on_decode,
)
from router.upstream import Reply
from router.upstream.vllm import NixlPrefilled, PrefillEngine, push_decode_body


class PushPath(SplitPath):
    """A healthy decode instance, then a healthy prefill engine, the least busy first."""

    def __init__(
        self,
        engines: Sequence[PrefillEngine],
        decode: ServerSet,
        selection: PathSelection,
        deps: NativeDeps,
        whole_when: WholeWhen | None = None,
    ) -> None:
        self._engines = {engine.url: engine for engine in engines}
        prefill = selection.server_set(list(self._engines), "push:prefill")
        super().__init__(prefill, decode, selection, deps, whole_when)

    async def open(self, request: RoutedRequest, stack: AsyncExitStack) -> Answer:
        affinity = await self.affinity(request)
        if (whole_choice := self._whole_on(request, affinity)) is not None:
            # One leg: sent again elsewhere if its server was unreachable.

            async def whole(choice: Choice) -> Answer:
                chosen(request, choice, self._decode)
                go_on = self.going_on(request, stack)
                return await whole_on_decode(
                    self._upstreams, stack, choice.url, request, self._metrics, go_on
                )

            return await call_on(
                self._decode, whole, hold_on=stack, request=affinity, first=whole_choice
            )
        decode_first, prefill_first = planned_servers(request, self._decode, self._prefill)
        decode_choice = decode_first or self._decode.pick(request=affinity)
        decode_url = stack.enter_context(self._decode.hold(decode_choice.url, affinity))
        chosen(request, decode_choice, self._decode)
        # The prefill engine is held only while its leg runs; the callback covers a leg
        # cancelled before it started.
        prefill_hold = ExitStack()
        stack.callback(prefill_hold.close)
        prefill_choice = prefill_first or self._prefill.pick(request=affinity)
        prefill_url = prefill_hold.enter_context(self._prefill.hold(prefill_choice.url, affinity))
        request.access.prefill = prefill_url
        engine = self._engines[prefill_url]
        go_on = self.going_on(request, stack)

        async def prefill() -> NixlPrefilled:
            with prefill_hold:
                leg = run_prefill(self._upstreams, prefill_url, request)
                return await _judged(self._prefill, prefill_choice, leg)

        async def decode() -> Reply:
            body = push_decode_body(request.body, engine, request.request_id)
            leg = send_decode(self._upstreams, stack, decode_url, request, body, go_on)
            return await _judged(self._decode, decode_choice, leg)

        try:
            answer, reply = await both_or_cancel(prefill(), decode())
        except UpstreamError as exc:
            if not self.resends(request, exc):
                raise
            return await self.resent(request, stack, affinity, exc)
        return decode_answer(reply, answer, request, self._metrics, go_on)


T = TypeVar("T")


async def _judged(servers: ServerSet, choice: Choice, leg: Awaitable[T]) -> T:
    """The leg's result; its outcome reported to the server's health."""
    try:
        result = await leg
    except BaseException as exc:
        if (outcome := outcome_of(exc)) is not None:
            servers.report(choice.url, outcome)
        raise
    servers.report(choice.url, "ok")
    return result


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
