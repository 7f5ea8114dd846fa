"""Client connections held to deadlines and a bound: uvicorn's httptools protocol, with a
clock on reading each request and a cap on how many connections are open.

uvicorn times a connection only between requests (`timeout_keep_alive`): a client that
never finishes its request holds its connection, and a file descriptor, for ever. Here:

* a new connection must start its first request within `first_request_timeout_s`;
* a request's head (request line and headers) must arrive within `head_timeout_s` of its
  first byte, and its body within `body_timeout_s` of the head;
* beyond `max_connections` open connections, a new one may still ask for `/health`,
  `/ready` or `/metrics` (an operator's probe) and is answered 503 for anything else, then
  closed; beyond a small reserve above that, it is closed at once.

Only reading a request is timed: an answer being sent (a long stream) is never cut. A
request that misses its deadline is answered 408 when no answer has started, and its
connection closed.

Each connection refused or closed this way is told to the protocol's `on_refused`, with its
reason (`RefusalReason`), for the metrics.

An answer may also ask for its head to go out with the first bytes of its body
(`HOLD_HEAD`): one write, so one segment and one wake-up of the client rather than two.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from router.errors import GatewayError, InvalidRequest, Unavailable
from router.serving.response import HOLD_HEAD

log = logging.getLogger("pd_gateway")

OPERATOR_PATHS = frozenset({"/health", "/ready", "/metrics"})
OVERFLOW_RESERVE = 64
"""Connections above `max_connections` kept open for an operator's probes."""
FD_HEADROOM = 512
"""Descriptors kept for everything else: the upstream pools, Redis, tokenizer files."""
MAX_HEAD_BYTES = 64 * 1024
"""A request line and headers longer than this are refused (431)."""


RefusalReason = Literal[
    "max_connections",
    "overflow_reserve",
    "first_request_timeout",
    "head_timeout",
    "body_timeout",
    "headers_too_large",
]
"""Why a connection was refused or closed: over `max_connections` (answered 503), over the
reserve above it too (closed unanswered), or a request too slow or its head too large."""


@dataclass(frozen=True, slots=True)
class FrontDoorLimits:
    first_request_timeout_s: float
    head_timeout_s: float
    body_timeout_s: float
    max_connections: int


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to the hard limit; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def connection_limit(configured: int, fd_limit: int) -> int:
    """`configured`, or less if the descriptor limit could not hold that many connections."""
    usable = max(1, fd_limit - FD_HEADROOM - OVERFLOW_RESERVE)
    if configured <= usable:
        return configured
    log.warning(
        "server.max_connections is %d, but the open-file limit (%d) leaves room for %d: using %d",
        configured,
        fd_limit,
        usable,
        usable,
    )
    return usable


class OpenCount(Protocol):
    """What counts the open connections (a gauge)."""

    def inc(self) -> None: ...

    def dec(self) -> None: ...


class _Uncounted:
    def inc(self) -> None:
        pass

    def dec(self) -> None:
        pass


def protocol_class(
    limits: FrontDoorLimits,
    on_refused: Callable[[RefusalReason], None] = lambda _: None,
    open_connections: OpenCount | None = None,
) -> type[FrontDoorProtocol]:
    """The protocol class for uvicorn's `http` option, bound to `limits`, told of each
    refusal through `on_refused` and of each connection opened and closed through
    `open_connections`."""
    attributes = {
        "limits": limits,
        "on_refused": staticmethod(on_refused),
        "open_connections": open_connections or _Uncounted(),
    }
    return type("BoundFrontDoorProtocol", (FrontDoorProtocol,), attributes)


class FrontDoorProtocol(HttpToolsProtocol):
    limits: FrontDoorLimits
    on_refused: Callable[[RefusalReason], None]
    open_connections: OpenCount

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._in_head = True  # what comes next belongs to a request's head
        self._head_bytes = 0  # of the head being read, as far as it came
        self._overflow = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.open_connections.inc()  # connection_lost follows every connection_made
        super().connection_made(transport)
        self._writes = HeadHold(transport, self.loop)
        self.transport = cast(asyncio.Transport, self._writes)
        open_now = len(self.connections)
        if open_now > self.limits.max_connections + OVERFLOW_RESERVE:
            self.on_refused("overflow_reserve")
            transport.close()
            return
        if open_now > self.limits.max_connections:
            self._overflow = True
            self.app = _operator_only(self.app, self.on_refused)
        self._arm(self.limits.first_request_timeout_s, self._first_request_too_slow)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.open_connections.dec()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        was_in_head = self._in_head
        super().data_received(data)
        # Counted once parsed, and only a chunk that was all head: one that ended a head
        # or a body may hold more than a head.
        if was_in_head and self._in_head and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                message = f"the request's line and headers exceed {MAX_HEAD_BYTES} bytes"
                self.on_refused("headers_too_large")
                self._too_much(431, "headers_too_large", message)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.limits.head_timeout_s, self._head_too_slow)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm()
        self.scope[HOLD_HEAD] = self._writes.hold_next  # type: ignore[literal-required]
        super().on_headers_complete()
        if self._overflow:
            self.cycle.keep_alive = False
        queued = bool(self.pipeline) and self.pipeline[0][0] is self.cycle
        if not queued:  # a queued request's body is not read until its turn
            self._arm(self.limits.body_timeout_s, self._body_too_slow)

    def on_message_complete(self) -> None:
        self._disarm()
        self._in_head = True
        super().on_message_complete()

    def _first_request_too_slow(self) -> None:
        self.on_refused("first_request_timeout")
        self.transport.close()

    def _head_too_slow(self) -> None:
        self.on_refused("head_timeout")
        seconds = self.limits.head_timeout_s
        self._too_much(408, "request_timeout", f"the request's headers took over {seconds} s")

    def _too_much(self, status: int, code: str, message: str) -> None:
        """Refuse the request whose head is being read, or, while the previous request is
        still being answered, close the connection once it is."""
        if self._answering():
            self._close_after_answer()
        else:
            self._refuse(status, code, message)

    def _body_too_slow(self) -> None:
        self.on_refused("body_timeout")
        cycle = self.cycle
        if self._answering():
            self._close_after_answer()
        elif cycle.response_complete:  # answered without reading it all: drop the rest
            self.transport.close()
        else:
            # The app is waiting for the body: it reads a disconnect and its answer is
            # dropped; the client reads this one.
            cycle.disconnected = True
            cycle.message_event.set()
            seconds = self.limits.body_timeout_s
            self._refuse(408, "request_timeout", f"the request body took over {seconds} s")

    def _answering(self) -> bool:
        cycle = self.cycle
        return cycle is not None and cycle.response_started and not cycle.response_complete

    def _close_after_answer(self) -> None:
        self.cycle.keep_alive = False
        self.flow.pause_reading()

    def _refuse(self, status: int, code: str, message: str) -> None:
        self._disarm()
        if not self.transport.is_closing():
            error = InvalidRequest(message, status=status, code=code)
            self.transport.write(_raw_response(status, error))
            self.transport.close()

    def _arm(self, seconds: float, then: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None


class HeadHold:
    """A connection's transport that can hold one write (a response's head) back until the
    next one, which then carries both; held bytes that nothing follows at once go out on the
    loop's next turn. Everything else is the transport's own."""

    __slots__ = ("_held", "_holding", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._holding = False
        self._held: bytes | None = None

    def hold_next(self) -> None:
        self._holding = True

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif self._holding:
            self._holding = False
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _raw_response(status: int, error: GatewayError) -> bytes:
    body = orjson.dumps(error.body())
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def _operator_only(app: Any, on_refused: Callable[[RefusalReason], None]) -> Any:
    """`app` for the operator's paths; a 503 for anything else."""
    busy = orjson.dumps(
        Unavailable("the gateway has too many open connections", code="too_many_connections").body()
    )

    async def serve(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPERATOR_PATHS:
            await app(scope, receive, send)
            return
        on_refused("max_connections")
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(busy)).encode()),
            (b"connection", b"close"),
            (b"retry-after", b"1"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": busy})

    return serve
