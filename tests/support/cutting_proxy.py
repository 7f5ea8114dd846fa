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
        # The connections' tasks: `start_server` keeps no reference to the task it makes of
        # each, and one waiting on a transport that is neither reading nor writing is
        # reachable from nothing else; collected mid-test, it left its sockets unclosed.
        self._serving: set[asyncio.Task[None]] = set()
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
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        """Every connection closed, every task ended: nothing left for the loop's close."""
        assert self._server is not None
        self._server.close()
        # A connection accepted as the server closed gets its task a turn later: again
        # until none is left.
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()
        # A transport closed or aborted by a cancelled task (one cancelled as its connection
        # was made, too) finishes closing on the loop's next turns: before the loop stops.
        for _ in range(2):
            await asyncio.sleep(0)

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
            self._loop.close()

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)
        try:
            server_in, server_out = await asyncio.open_connection(*self._target)
        except OSError:
            client_out.transport.abort()
            return
        answer: list[int | None] = [None]  # bytes of the answer to cut still to pass

        async def upward() -> None:
            while data := await client_in.read(65536):
                if self.cuts == 0 and data.startswith(self._prefix):
                    self.cuts += 1  # this request's answer is cut
                    answer[0] = self._after
                server_out.write(data)
                await server_out.drain()

        requests = asyncio.ensure_future(upward())
        try:
            while data := await server_in.read(65536):
                left = answer[0]
                if left is not None and len(data) >= left:
                    client_out.write(data[:left])
                    await client_out.drain()
                    return
                if left is not None:
                    answer[0] = left - len(data)
                client_out.write(data)
                await client_out.drain()
        finally:
            requests.cancel()
            for writer in (client_out, server_out):
                writer.transport.abort()
