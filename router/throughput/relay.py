"""The response a throughput mode returns: it runs the upstream legs when it is sent.

Running the legs inside the response, next to the ASGI `receive` channel, is what lets a
client disconnect abort them at any point (waiting for a prefill, for the decode's headers,
or mid-stream): the exchange runs as a task that is cancelled when the client goes away,
and everything it opened (httpx streams, balancer holds) is closed on the way out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, aclosing
from functools import partial
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.errors import GatewayError, error_json
from router.throughput.base import ENDPOINT_PATHS, Endpoint
from router.throughput.upstream import Upstream, once

log = logging.getLogger("pd_gateway.throughput")

OpenUpstream = Callable[[AsyncExitStack], Awaitable[Upstream]]


class RelayResponse(Response):
    """Sends what `open_upstream` produces, with `headers` added (error answers included).

    `open_upstream` gets an exit stack for everything that must be closed when the response
    ends, however it ends; a `GatewayError` it raises is rendered as an OpenAI error.
    """

    def __init__(self, open_upstream: OpenUpstream, *, headers: Mapping[str, str]) -> None:
        # Status and content type are only known once the upstream has answered; headers set
        # here or later through `self.headers` are added to whatever it answers.
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = raw_headers(headers)
        self._open = open_upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stack = AsyncExitStack()
        exchange = asyncio.ensure_future(self._exchange(stack, send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((exchange, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            exchange.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait((exchange, watch))
                await stack.aclose()
        if not watch.cancelled() and watch.exception() is None:
            log.debug("client went away; upstream legs aborted")
        if exchange.cancelled():
            return
        try:
            exchange.result()
        except OSError:
            log.debug("client went away while being sent the answer")

    async def _exchange(self, stack: AsyncExitStack, send: Send) -> None:
        try:
            upstream = await self._open(stack)
        except GatewayError as error:
            upstream = error_upstream(error)
        names = {name for name, _ in self.raw_headers}
        headers = [(k, v) for k, v in upstream.headers if k not in names] + self.raw_headers
        await send({"type": "http.response.start", "status": upstream.status, "headers": headers})
        async with aclosing(upstream.chunks) as chunks:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def error_upstream(error: GatewayError) -> Upstream:
    headers = [(b"content-type", b"application/json"), *raw_headers(error.headers)]
    return Upstream(error.status, headers, once(error_json(error)))


def raw_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class RelayedPath:
    """What every mode shares: its answer is a RelayResponse running the mode's `_open`."""

    async def serve(
        self,
        body: dict[str, Any],
        *,
        endpoint: Endpoint,
        request_id: str,
        response_headers: dict[str, str],
    ) -> Response:
        return RelayResponse(
            partial(self._open, body, ENDPOINT_PATHS[endpoint], request_id),
            headers=response_headers,
        )

    async def _open(
        self, body: dict[str, Any], path: str, request_id: str, stack: AsyncExitStack
    ) -> Upstream:
        raise NotImplementedError
