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
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvicorn
import uvloop
from starlette.types import ASGIApp, Receive, Scope, Send

StreamHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Member:
    """One simulator ready to serve: its app, its listening sockets, its readiness fields."""

    app: ASGIApp
    http: socket.socket
    streams: list[tuple[socket.socket, StreamHandler]] = field(default_factory=list)
    ready: dict[str, Any] = field(default_factory=dict)
    gate: Gate | None = None


class Gate:
    """Closes one member's HTTP listening socket for a while, so connections are refused.

    Connections already open stay served. The socket is bound again on the same port when
    the time is up (``serve`` binds the gate to the running uvicorn server).
    """

    def __init__(self) -> None:
        self._server: uvicorn.Server | None = None
        self._port = 0
        self._host = ""
        self._reopen: asyncio.Task[None] | None = None

    def bind(self, server: uvicorn.Server, sock: socket.socket) -> None:
        """Attach the gate to the uvicorn server listening on ``sock``."""
        self._server = server
        self._host, self._port = sock.getsockname()[:2]

    @property
    def closed(self) -> bool:
        """Connections are being refused now."""
        return self._reopen is not None and not self._reopen.done()

    async def refuse_for(self, seconds: float) -> None:
        """Stop listening now and listen again after ``seconds``."""
        server = self._server
        if server is None or self.closed:
            return
        for listener in list(server.servers):
            if any(port_of(sock) == self._port for sock in listener.sockets):
                listener.close()
                server.servers.remove(listener)
        self._reopen = asyncio.ensure_future(self._listen_after(server, seconds))

    async def _listen_after(self, server: uvicorn.Server, seconds: float) -> None:
        await asyncio.sleep(seconds)
        config = server.config

        def protocol() -> asyncio.Protocol:
            # uvicorn types its HTTP protocol classes as a bare asyncio.Protocol, whose
            # constructor takes no arguments; uvicorn's own server makes the same call.
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=server.server_state, app_state={}
            )

        sock = listen(self._host, self._port)
        listener = await asyncio.get_running_loop().create_server(
            protocol, sock=sock, backlog=config.backlog
        )
        server.servers.append(listener)


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

    def __init__(self, apps: dict[int, ASGIApp]) -> None:
        self._apps = apps

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        await self._apps[server[1] if server else -1](scope, receive, send)


async def serve(members: list[Member], ready: dict[str, Any]) -> None:
    """Serve every member's app and raw TCP handlers until signalled; announce ``ready``."""
    stream_servers = [
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
    server = uvicorn.Server(config)
    for member in members:
        if member.gate is not None:
            member.gate.bind(server, member.http)
    announce(ready)
    try:
        await server.serve(sockets=[m.http for m in members])
    finally:
        for stream_server in stream_servers:
            stream_server.close()


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a simulator's async main on uvloop."""
    uvloop.run(main())
