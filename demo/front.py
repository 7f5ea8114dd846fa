"""The demo's one address in front of its gateway replicas: a round-robin TCP relay, as a
Kubernetes Service would be. Each client connection goes to the next replica that accepts
it; a replica that refuses (killed, stopped) is skipped, so a new connection never lands on
a dead one. A connection already open to a replica ends with it, as it would in a cluster.

It runs its own event loop in a daemon thread: the demo's main thread keeps waiting for
signals and watching its children.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import threading
from collections.abc import Callable

from demo.plan import DemoError

_CHUNK = 64 * 1024


class RoundRobinFront:
    """`start()` binds `host:port` (0: a free port) and relays to `backends()`, a list of
    (host, port) read afresh for every connection; `stop()` closes it."""

    def __init__(self, host: str, port: int, backends: Callable[[], list[tuple[str, int]]]):
        self._backends = backends
        self._turn = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="demo-front")
        self._thread.daemon = True
        self._server: asyncio.Server | None = None
        self._sock = _bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self) -> None:
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        started.result(timeout=10)

    def stop(self) -> None:
        if not self._thread.is_alive():
            self._sock.close()
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._relay, sock=self._sock)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:  # no replica accepts: the client sees the connection close
            writer.close()
            return
        up_reader, up_writer = upstream
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        backends = self._backends()
        start = next(self._turn)
        for i in range(len(backends)):
            host, port = backends[(start + i) % len(backends)]
            try:
                return await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            except (OSError, TimeoutError):
                continue  # refused: that replica has gone; try the next
        return None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until end of file, then half-close; a reset ends both directions."""
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, RuntimeError):  # reset, or written after the other side closed
        writer.close()
        # the other direction's read fails or ends once the peer sees the close


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DemoError(
            f"the replicas' front cannot listen on {host}:{port}: {exc.strerror or exc}"
            " (try --port-offset or --free-ports)"
        ) from None
    return sock
