"""Process runner shared by the simulators: listening sockets, uvicorn, readiness line.

Sockets are bound and listening before anything is announced, so a peer that reads the
``SIM-READY {...}`` line can connect at once (early connections wait in the backlog).
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
import uvloop

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0 picks a free port) and listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def port_of(sock: socket.socket) -> int:
    """The port a socket is bound to."""
    return int(sock.getsockname()[1])


def announce(ports: dict[str, Any]) -> None:
    """Print the one readiness line the stack launcher waits for."""
    sys.stdout.write(f"SIM-READY {json.dumps(ports)}\n")
    sys.stdout.flush()


async def serve(
    app: Any,
    http_sock: socket.socket,
    stream_servers: list[tuple[socket.socket, StreamHandler]],
    ready: dict[str, Any],
) -> None:
    """Serve ``app`` on ``http_sock`` and raw TCP handlers on their sockets until signalled."""
    servers = [await asyncio.start_server(handler, sock=sock) for sock, handler in stream_servers]
    config = uvicorn.Config(
        app,
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
        timeout_graceful_shutdown=1,
    )
    announce(ready)
    try:
        await uvicorn.Server(config).serve(sockets=[http_sock])
    finally:
        for server in servers:
            server.close()


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Run a simulator's async main on uvloop."""
    uvloop.run(main())
