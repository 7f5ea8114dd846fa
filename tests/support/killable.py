"""Simulated vLLM prefill servers each in a process of its own, for tests that kill one
(SIGKILL: no clean-up, its connections cut) and start it again on the same port.

Each server is a one-server `SimStack`; a restart is a new one, given the port and engine
id the server had (the simulator's last `--port` and `--engine-id` win).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from sim.stack import ServerInfo, SimStack


class KillableServer:
    def __init__(self, index: int, *, model: str, args: Sequence[str] = ()) -> None:
        self._engine_id = f"prefill-{index}"
        self._model = model
        self._args = list(args)
        self._port = 0
        self._stack: SimStack | None = None
        self._info: ServerInfo | None = None

    @property
    def url(self) -> str:
        assert self._info is not None
        return self._info.url

    def start(self) -> KillableServer:
        """Start the server: on a free port the first time, on its own port after that."""
        pinned = ["--engine-id", self._engine_id, "--port", str(self._port)]
        stack = SimStack(
            nodes=0,
            prefills=1,
            model=[self._model],
            prefill_args=self._args,
            instance_args={"prefill-0": pinned},
        )
        self._stack = stack.start()
        self._info = stack.prefills[0]
        self._port = self._info.port
        return self

    def kill(self) -> None:
        """SIGKILL the server's process and reap it: once this returns, its port refuses."""
        assert self._stack is not None and self._info is not None
        os.killpg(self._info.pid, signal.SIGKILL)
        self._stack.stop()

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.stop()


@contextmanager
def killable_servers(
    count: int, *, model: str, args: Sequence[str] = ()
) -> Iterator[list[KillableServer]]:
    """`count` servers started in parallel, stopped when the block ends."""
    servers = [KillableServer(i, model=model, args=args) for i in range(count)]
    try:
        with ThreadPoolExecutor(max_workers=count) as pool:
            for started in [pool.submit(s.start) for s in servers]:
                started.result()
        yield servers
    finally:
        for server in servers:
            server.stop()
