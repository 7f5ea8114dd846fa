"""Process runner shared by the simulators: listening sockets, uvicorn, readiness line.

Sockets are bound and listening before anything is announced, so a peer that reads the
``SIM-READY {...}`` line can connect at once (early connections wait in the backlog).
One process can serve several simulators (``Member``s): one uvicorn server listens on
every member's HTTP socket and hands each request to the app of the port it came in on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
import uvloop
from starlette.types import Receive, Scope, Send

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Member:
    """One simulator ready to serve: its app, its listening sockets, its readiness fields."""

    app: Any
    http: socket.socket
    streams: list[tuple[socket.socket, StreamHandler]] = field(default_factory=list)
    ready: dict[str, Any] = field(default_factory=dict)


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


class ByPort:
    """ASGI app passing each request to the app serving the local port it arrived on."""

    def __init__(self, apps: dict[int, Any]) -> None:
        self._apps = apps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        await self._apps[server[1] if server else -1](scope, receive, send)


async def serve(members: list[Member], ready: dict[str, Any]) -> None:
    """Serve every member's app and raw TCP handlers until signalled; announce ``ready``."""
    servers = [
        await asyncio.start_server(handler, sock=sock)
        for member in members
        for sock, handler in member.streams
    ]
    app = members[0].app if len(members) == 1 else ByPort({port_of(m.http): m.app for m in members})
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
        await uvicorn.Server(config).serve(sockets=[m.http for m in members])
    finally:
        for server in servers:
            server.close()


def run(main: Callable[[], Awaitable[None]]) -> None:
    """Run a simulator's async main on uvloop."""
    uvloop.run(main())
