"""The application's state: every shared object, built once at startup and closed at shutdown.

Grouped by lifetime: configuration (immutable), transports (one HTTP client with pooled
connections), per-model objects (tokenizer, gate, latency pool), and background tasks
(cleanups that outlive the request that started them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import httpx

from router.classify import Classifier
from router.config import GatewayConfig, compile_rules
from router.gate import Gate, make_gate
from router.gate.prober import admit_ready_nodes, probe_forever
from router.latency.path import LatencyPool
from router.metrics import Metrics
from router.prompt_tokens import PromptCounter
from router.throughput import ThroughputPath, make_throughput_path
from router.tokenizer import LoadedTokenizer, load_tokenizer, tokenizer_path

log = logging.getLogger("pd_gateway")


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
        self.throughput: dict[str, ThroughputPath] = {}
        self.classifier: Classifier
        self._tasks: set[asyncio.Task[None]] = set()
        self._probers: list[asyncio.Task[None]] = []
        self.metrics = Metrics(lambda: self.gates)
        self.draining = False  # set on SIGTERM: /ready fails, in-flight requests finish

    async def start(self) -> None:
        """Load tokenizers (off the event loop) and build each model's paths."""
        config = self.config
        loaded = await asyncio.gather(
            *(
                asyncio.to_thread(load_tokenizer, m.tokenizer, base_dir=config.base_dir)
                for m in config.models
            )
        )
        counters = {}
        for model, tokenizer in zip(config.models, loaded, strict=True):
            self.tokenizers[model.name] = tokenizer
            counters[model.name] = await asyncio.to_thread(
                PromptCounter, tokenizer, tokenizer_path(model.tokenizer, base_dir=config.base_dir)
            )
            if model.throughput is not None:
                self.throughput[model.name] = make_throughput_path(
                    model.throughput, http=self.http, timeouts=config.timeouts
                )
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
                metrics=self.metrics,
            )
        self.classifier = Classifier(config, compile_rules(config), counters)
        await asyncio.gather(
            *(
                admit_ready_nodes(gate, self.http, timeout_s=config.timeouts.connect_s)
                for gate in self.gates.values()
            )
        )
        for gate in self.gates.values():
            self._probers.append(
                asyncio.create_task(
                    probe_forever(
                        gate,
                        self.http,
                        interval_s=config.gate.probe_interval_s,
                        timeout_s=config.timeouts.connect_s,
                    )
                )
            )

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a cleanup in the background; shutdown waits for it."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a background cleanup failed", exc_info=task.exception())

    @property
    def background_tasks(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        for prober in self._probers:
            prober.cancel()
        for pool in self.latency.values():
            pool.close_all()
        if self._tasks:
            # The longest a cleanup can take: consume a transfer, or cancel then drain.
            t = self.config.timeouts
            grace_s = max(t.kv_transfer_s + 5, t.cancel_s + t.decode_stall_s) + t.connect_s
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        for gate in self.gates.values():
            await gate.close()
        await self.http.aclose()
