"""Test equipment for the throughput path: scripted upstreams, a tiny app, a real-socket server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from policies import Decision
from router.config import UpstreamsConfig
from router.openai.endpoints import ENDPOINTS
from router.selection.server_set import ServerSet
from router.serving import PathResponse, RoutedRequest, ServePath
from router.upstream import Upstreams as UpstreamClients
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts

RID = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
TIMEOUTS = Timeouts(connect_s=2.0, prefill_s=10.0)
ROUTE_HEADERS = {"x-pd-route": "throughput", "x-pd-rule": "batch"}

Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


@dataclass
class Seen:
    """One request an upstream received."""

    host: str
    path: str
    headers: httpx.Headers
    body: Any


@dataclass
class Upstreams:
    """Scripted upstream servers, one handler per host; every request is recorded."""

    handlers: dict[str, Handler] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def on(self, host: str, handler: Handler) -> None:
        self.handlers[host] = handler

    def pool(self) -> UpstreamClients:
        """The gateway's upstream clients, with these scripted servers as the network."""
        return UpstreamClients(
            UpstreamsConfig(), TIMEOUTS, transport=HttpxTransport(httpx.MockTransport(self._handle))
        )

    def to(self, host: str) -> list[Seen]:
        return [s for s in self.seen if s.host == host]

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        content = await request.aread()
        self.seen.append(
            Seen(request.url.host, request.url.path, request.headers, orjson.loads(content))
        )
        return await self.handlers[request.url.host](request)


def answer(payload: Any, status: int = 200) -> Handler:
    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, content=orjson.dumps(payload), headers={"content-type": "application/json"}
        )

    return handle


def events(*chunks: bytes, then: Exception | None = None) -> Handler:
    """An SSE answer sent as the given network chunks, optionally failing after them."""

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk
        if then is not None:
            raise then

    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    return handle


def failing(exc: Exception) -> Handler:
    async def handle(request: httpx.Request) -> httpx.Response:
        raise exc

    return handle


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


DECISION = Decision(
    path="throughput", rule="batch", priority=0, on_saturation="queue", max_queue_wait_ms=None
)


def routed(body: dict[str, Any], *, endpoint: str = "chat", request_id: str = RID) -> RoutedRequest:
    spec = ENDPOINTS["chat" if endpoint == "chat" else "completions"]
    parsed = spec.request.model_construct(**body)  # scripted bodies need not be valid
    return RoutedRequest(spec, parsed, body, DECISION, request_id, dict(ROUTE_HEADERS))


def app_for(
    path: ServePath, *, request_id: str = RID, served: list[RoutedRequest] | None = None
) -> Starlette:
    """The smallest gateway around one throughput path: parse, delegate, return. Each
    request goes into `served`, for its access record."""

    async def handle(request: Request) -> Response:
        body = await request.json()
        endpoint = "chat" if request.url.path == "/v1/chat/completions" else "completions"
        one = routed(body, endpoint=endpoint, request_id=request_id)
        if served is not None:
            served.append(one)
        return PathResponse(path, one)

    return Starlette(
        routes=[
            Route("/v1/chat/completions", handle, methods=["POST"]),
            Route("/v1/completions", handle, methods=["POST"]),
        ]
    )


def asgi_client(
    path: ServePath, *, request_id: str = RID, served: list[RoutedRequest] | None = None
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app_for(path, request_id=request_id, served=served))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


@asynccontextmanager
async def serving(app: Any, *, deadline_s: float = 10.0) -> AsyncIterator[str]:
    """Serve `app` with uvicorn on a free port of this loop; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        http="httptools",
        loop="none",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started, deadline_s=deadline_s, what="uvicorn started")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def wait_until(check: Callable[[], bool], *, deadline_s: float = 5.0, what: str = "") -> None:
    """Poll a real state until it holds; fail with `what` after the deadline."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    while not check():
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.01)


def balancers(path: ServePath) -> dict[str, dict[str, int]]:
    """Requests in flight per upstream URL, by the path's balancer attribute."""
    return {
        name.lstrip("_"): value.outstanding()
        for name, value in vars(path).items()
        if isinstance(value, ServerSet)
    }


def in_flight(path: ServePath) -> int:
    """Requests the path's balancers count as outstanding, over all its pools."""
    return sum(n for pool in balancers(path).values() for n in pool.values())


P = TypeVar("P")


def made(path: object, kind: type[P]) -> P:
    """`path`, which the factory must have made a `kind`."""
    assert isinstance(path, kind)
    return path
