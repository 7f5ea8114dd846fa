"""A TCP proxy in front of one server that cuts one answer short: the first connection
whose request starts with `prefix` has its answer cut after `after` bytes, as a server
dying mid-answer would; every other connection passes whole. It runs its own event loop
on a thread, so a synchronous test can stand it between a gateway process and a server."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType


class CuttingProxy:
    def __init__(self, target_host: str, target_port: int, *, prefix: bytes, after: int) -> None:
        self._target = (target_host, target_port)
        self._prefix = prefix
        self._after = after
        self.cuts = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._server: asyncio.Server | None = None
        self.url = ""

    def __enter__(self) -> CuttingProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the cutting proxy did not start")
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            self._loop.close()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        server_in, server_out = await asyncio.open_connection(*self._target)
        first = await client_in.read(65536)
        cut = self.cuts == 0 and first.startswith(self._prefix)
        if cut:
            self.cuts += 1
        server_out.write(first)
        upward = asyncio.ensure_future(_pipe(client_in, server_out))
        try:
            await _pipe(server_in, client_out, limit=self._after if cut else None)
        finally:
            upward.cancel()
            for writer in (client_out, server_out):
                writer.transport.abort()


async def _pipe(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, limit: int | None = None
) -> None:
    """Bytes from `source` to `sink` until it ends, or `limit` bytes have gone."""
    sent = 0
    while data := await source.read(65536):
        if limit is not None and sent + len(data) >= limit:
            sink.write(data[: limit - sent])
            await sink.drain()
            return
        sent += len(data)
        sink.write(data)
        await sink.drain()
