"""The servers of a model's native path that serve a request whole, prefill and decode on one:
the decode instances in `pull` and `push` mode, the proxy in `proxy` mode (which splits it
into legs of its own). They go on with an answer whose decode failed mid-stream: a TileRT
node's when no other node is free, or a decode server's of the native path
(`router.upstream.native_decode`)."""

from __future__ import annotations

from collections.abc import Collection
from contextlib import AsyncExitStack
from typing import Any

from router.selection import Choice, ServerSet, call_on
from router.telemetry import tracing
from router.upstream import Reply, Target, Upstreams


class WholeServing:
    """A healthy server of one set, the least busy first; one that cannot be reached is
    replaced by another of the set once."""

    def __init__(self, servers: ServerSet, target: Target, upstreams: Upstreams) -> None:
        self._servers = servers
        self._target = target
        self._upstreams = upstreams

    async def open_stream(
        self,
        path: str,
        body: dict[str, Any],
        *,
        request_id: str,
        stack: AsyncExitStack,
        first: Choice | None = None,
    ) -> tuple[Reply, Choice]:
        """Send `body` (a streamed request) and return once a server answered 200, with the
        server chosen (`first`, if given: `pick`); an error status raises. The reply and the
        server's hold close with `stack`. Each wait for the head, then for each line's end,
        is bounded by the prefill timeout, as on the native path."""
        prefill_s = self._upstreams.timeouts.prefill_s

        async def send(choice: Choice) -> tuple[Reply, Choice]:
            with tracing.stage(tracing.DECODE, upstream=choice.url):
                reply = await self._upstreams.open(
                    self._target,
                    "POST",
                    choice.url,
                    path,
                    body=body,
                    read_s=prefill_s,
                    request_id=request_id,
                    stack=stack,
                )
                tracing.upstream_answered(reply.status)
                if reply.status != 200:
                    raise await reply.failure()
            return reply, choice

        return await call_on(self._servers, send, hold_on=stack, first=first)

    def pick(self, exclude: Collection[str] = ()) -> Choice:
        """The server `open_stream` would choose, not one of `exclude` if the set has
        another."""
        return self._servers.pick(exclude=exclude)
