"""The application's state: every shared object, built once at startup and closed at shutdown.

Grouped by lifetime: configuration (immutable), transports (the upstream clients), one
runtime per served model (tokenizer, pool, paths), and background tasks (cleanups that
outlive the request that started them, and the node probers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from router.auth import AdminAuth, ClientAuth
from router.classify import Classifier
from router.config import GatewayConfig, compile_rules
from router.gate import Gate, GateSnapshot
from router.gate.prober import admit_ready_nodes, probe_forever
from router.latency.protocol import LatencyDeps
from router.metrics import Metrics
from router.models import ModelRuntime, build_model
from router.prompt_tokens import PromptCounter
from router.serving.live import LiveResponses
from router.tokenizer import load_tokenizer, tokenizer_path
from router.upstream import Upstreams

log = logging.getLogger("pd_gateway")


class AppState:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.client_auth = ClientAuth(config)
        self.admin_auth = AdminAuth(config)
        self.upstreams = Upstreams(config.upstreams, config.timeouts)
        self.metrics = Metrics()
        self.models: dict[str, ModelRuntime] = {}
        self.classifier: Classifier
        self._tasks: set[asyncio.Task[None]] = set()
        self._probers: list[asyncio.Task[None]] = []
        self.draining = False  # set on SIGTERM: /ready fails, in-flight requests finish
        self.live = LiveResponses()  # answers being sent, for shutdown to wait for

    @property
    def gates(self) -> dict[str, Gate]:
        """Each model's TileRT pool, for the models that have one."""
        return {name: m.gate for name, m in self.models.items() if m.gate is not None}

    async def start(self) -> None:
        """Load tokenizers (off the event loop) and build each model's paths."""
        config = self.config
        deps = LatencyDeps(
            upstreams=self.upstreams,
            timeouts=config.timeouts,
            spawn=self.spawn,
            metrics=self.metrics,
        )
        loaded = await asyncio.gather(
            *(
                asyncio.to_thread(load_tokenizer, m.tokenizer, base_dir=config.base_dir)
                for m in config.models
            )
        )
        for model, tokenizer in zip(config.models, loaded, strict=True):
            counter = await asyncio.to_thread(
                PromptCounter, tokenizer, tokenizer_path(model.tokenizer, base_dir=config.base_dir)
            )
            self.models[model.name] = build_model(
                model, tokenizer=tokenizer, counter=counter, gate_config=config.gate, deps=deps
            )
        counters = {name: m.counter for name, m in self.models.items()}
        self.classifier = Classifier(config, compile_rules(config), counters)
        gates = list(self.gates.values())
        await asyncio.gather(*(admit_ready_nodes(gate, self.upstreams) for gate in gates))
        for gate in gates:
            self._probers.append(
                asyncio.create_task(
                    probe_forever(gate, self.upstreams, interval_s=config.gate.probe_interval_s)
                )
            )

    async def pool_snapshots(self) -> dict[str, GateSnapshot]:
        return {name: await gate.snapshot() for name, gate in self.gates.items()}

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
        for model in self.models.values():
            if model.latency is not None:
                model.latency.close_all()
        if self._tasks:
            # The longest a cleanup can take: consume a transfer, or cancel then drain.
            t = self.config.timeouts
            grace_s = max(t.kv_transfer_s + 5, t.cancel_s + t.decode_stall_s) + t.connect_s
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        for gate in self.gates.values():
            await gate.close()
        await self.upstreams.aclose()
