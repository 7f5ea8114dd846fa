"""A real uvicorn server behind the front door, on a free loopback port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from tests.throughput.support import wait_until


@asynccontextmanager
async def serving(app: Any, protocol: type[asyncio.Protocol]) -> AsyncIterator[int]:
    """`app` served with the `protocol` class (the front door's) on a free port; yields the
    port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        http=protocol,
        loop="none",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await wait_until(lambda: server.started, deadline_s=10, what="uvicorn started")
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()
