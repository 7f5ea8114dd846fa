"""The application's state: every shared object, built once at startup and closed at shutdown.

Grouped by lifetime: configuration (immutable), transports (one HTTP client with pooled
connections), per-model objects (tokenizer, gate, latency pool), and background tasks
(cleanups that outlive the request that started them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import httpx

from router.config import GatewayConfig
from router.gate import Gate, make_gate
from router.latency.path import LatencyPool
from router.tokenizer import LoadedTokenizer, load_tokenizer


class AppState:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
            timeout=httpx.Timeout(config.timeouts.prefill_s, connect=config.timeouts.connect_s),
        )
        self.tokenizers: dict[str, LoadedTokenizer] = {}
        self.gates: dict[str, Gate] = {}
        self.latency: dict[str, LatencyPool] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Load tokenizers (off the event loop) and build each model's pools."""
        loaded = await asyncio.gather(
            *(
                asyncio.to_thread(load_tokenizer, m.tokenizer, base_dir=self.config.base_dir)
                for m in self.config.models
            )
        )
        for model, tokenizer in zip(self.config.models, loaded, strict=True):
            self.tokenizers[model.name] = tokenizer
            if model.latency is None:
                continue
            gate = make_gate(self.config.gate, model.latency.nodes)
            self.gates[model.name] = gate
            self.latency[model.name] = LatencyPool(
                model=model,
                gate=gate,
                tokenizer=tokenizer,
                http=self.http,
                timeouts=self.config.timeouts,
                spawn=self.spawn,
            )

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a cleanup in the background; shutdown waits for it."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @property
    def background_tasks(self) -> int:
        return len(self._tasks)

    async def aclose(self, *, grace_s: float = 10.0) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        for gate in self.gates.values():
            await gate.close()
        await self.http.aclose()
