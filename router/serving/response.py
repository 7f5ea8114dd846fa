"""The one response type for every path: it runs the path when it is sent.

Running the path inside the response, next to the ASGI `receive` channel, is what lets a
client disconnect stop it at any point (queued for a slot, waiting for a prefill or an
upstream's headers, or mid-stream): the exchange runs as a task that is cancelled when the
client goes away, and everything the path opened (upstream streams, slots, balancer holds)
is closed on the way out. Errors raised before the answer starts are rendered here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from contextlib import AsyncExitStack, aclosing

import anyio
from prometheus_client import Gauge
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from router.errors import ClientGone, GatewayError, Unavailable
from router.openai.sse import EVENT_END
from router.serving.base import (
    Answer,
    LastChunk,
    RoutedRequest,
    ServePath,
    error_answer,
    raw_headers,
)
from router.serving.live import LiveResponses
from router.telemetry import tracing

log = logging.getLogger("pd_gateway")

SERVER_SEND = "pd_gateway.server_send"
"""A scope key: the ASGI server's own `send`, set by the app before any middleware.
The chunks of a body in progress go to it directly; the middlewares' `send` wrappers see
the start and the end of every answer, which is all they look at."""


HOLD_HEAD = "pd_gateway.hold_head"
"""A scope key, where the server offers it: a callable that holds the answer's head back
until the first bytes of its body, so that both leave in one write."""


class PathResponse(Response):
    """Sends what `path` answers for `request`, with `request.headers` added."""

    def __init__(
        self,
        path: ServePath,
        request: RoutedRequest,
        live: LiveResponses | None = None,
        in_flight: Gauge | None = None,
    ) -> None:
        """`in_flight`: a gauge that counts this answer while it is being served."""
        # Status and content type are only known once the path has answered.
        self.status_code = 200
        self.background = None
        self.body = b""
        self.raw_headers = []
        self._path = path
        self._request = request
        self._live = live
        self._in_flight = in_flight
        self._started = False
        self._streaming = False  # an event stream has started
        self._tail = EVENT_END  # the end of the last chunk sent
        self._hold_head: Callable[[], None] | None = None
        self._exchange_task: asyncio.Future[None] | None = None
        self._cut = False

    def cut(self) -> None:
        """Shutdown's grace period is over: end this answer properly (see `__call__`)."""
        self._cut = True
        if self._exchange_task is not None:
            self._exchange_task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._live is not None:
            self._live.add(self)
        if self._in_flight is not None:
            self._in_flight.inc()
        self._hold_head = scope.get(HOLD_HEAD)
        try:
            await self._serve(receive, send, scope.get(SERVER_SEND, send))
        finally:
            if self._in_flight is not None:
                self._in_flight.dec()
            if self._live is not None:
                self._live.discard(self)
            self._ended()

    def _ended(self) -> None:
        """The answer is over, however it ended (cut at shutdown included)."""
        if (ended := self._request.on_end) is None:
            return
        try:
            ended()
        except Exception:  # a bug in learning must not touch the answer
            log.exception("learning from an answer failed")

    async def _serve(self, receive: Receive, send: Send, server_send: Send) -> None:
        stack = AsyncExitStack()
        exchange = self._exchange_task = asyncio.ensure_future(
            self._exchange(stack, send, server_send)
        )
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait((exchange, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            exchange.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait((exchange, watch))
                await stack.aclose()
        if self._cut and exchange.cancelled():
            with contextlib.suppress(OSError):
                await self._end_cut(send)
            return
        if not watch.cancelled() and watch.exception() is None:
            log.debug("client went away; its request was stopped")
            if not self._started:
                # Nobody reads it, but it is counted like any answer (nginx's 499).
                with contextlib.suppress(Exception):
                    await self._start(send, error_answer(ClientGone("the client left")))
            return
        if exchange.cancelled():
            return
        try:
            exchange.result()
        except OSError:
            log.debug("client went away while being sent the answer")

    async def _exchange(self, stack: AsyncExitStack, send: Send, server_send: Send) -> None:
        try:
            answer = await self._path.open(self._request, stack)
        except GatewayError as error:
            self._request.access.ended_with(error)
            answer = error_answer(error)
        with tracing.stage(tracing.ANSWER, status=answer.status):
            await self._start(send, answer)
            last = b""  # held for the body's end, once the body has said it is its last
            async with aclosing(answer.chunks) as chunks:
                async for chunk in chunks:
                    if last:  # more came after it: it was not the last after all
                        await self._send_chunk(server_send, last)
                        last = b""
                    if isinstance(chunk, LastChunk):
                        last = bytes(chunk)
                    elif chunk:
                        await self._send_chunk(server_send, chunk)
            # What the answer holds upstream (a server's count of requests in flight, its
            # stream) is given back before the last bytes leave: a client that has the
            # whole answer and sends its next request at once finds it given back.
            await stack.aclose()
            await send({"type": "http.response.body", "body": last, "more_body": False})

    async def _send_chunk(self, server_send: Send, chunk: bytes) -> None:
        await server_send({"type": "http.response.body", "body": chunk, "more_body": True})
        self._tail = chunk[-2:]

    async def _end_cut(self, send: Send) -> None:
        """The gateway is shutting down and this answer could not finish in time."""
        error = Unavailable("the gateway is shutting down; retry", code="shutting_down")
        self._request.access.ended_with(error)
        if not self._started:
            answer = error_answer(error)
            await self._start(send, answer)
            async for chunk in answer.chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        elif self._streaming:
            gap = b"" if self._tail.endswith(EVENT_END) else EVENT_END
            last = gap + self._request.endpoint.stream_failure(error)
            await send({"type": "http.response.body", "body": last, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _start(self, send: Send, answer: Answer) -> None:
        ours = raw_headers(self._request.headers)
        names = {name for name, _ in ours}
        headers = [(k, v) for k, v in answer.headers if k not in names] + ours
        self._started = True
        self._streaming = any(
            k == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers
        )
        if self._hold_head is not None:
            self._hold_head()
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
