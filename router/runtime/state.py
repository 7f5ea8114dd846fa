"""The application's state: every shared object, built once at startup and closed at shutdown.

Grouped by lifetime: the process (upstream clients, metrics, the answers in flight,
cleanups that outlive their request, the background loops) and the configuration
(`epoch`: rules, keys and models, swapped whole on a reload).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Coroutine
from typing import Any

from router.capacity import PoolSize
from router.config import ConfigError, GatewayConfig, load_config
from router.gate import Gate, GateSnapshot
from router.latency.protocol import LatencyDeps
from router.node import configured_nodes
from router.node_lifecycle.facts import NodeFactsBook
from router.runtime.auth import Keys, upstream_credentials
from router.runtime.background import BackgroundLoops
from router.runtime.epoch import Changes, ConfigEpoch, build_epoch, check_tokenizer_files
from router.selection import KvEventsHub, ServerSet, load_snapshot
from router.serving.live import LiveResponses
from router.telemetry import logs
from router.telemetry.metrics import Metrics
from router.tenants.admission import Tenants
from router.tenants.store import make_limiter
from router.upstream import Timeouts, Upstreams

log = logging.getLogger("pd_gateway")

# Sections read once at start-up: a reload that changes them says so and leaves them.
RESTART_ONLY = ("server", "timeouts", "upstreams")


def check_quickly(config: GatewayConfig) -> None:
    """The start-up reads that take no time (every secret, each tokenizer file's presence),
    for `serve` to refuse a configuration before it listens; ConfigError names the field."""
    Keys.load(config)
    upstream_credentials(config)
    check_tokenizer_files(config)


class AppState:
    def __init__(self, config: GatewayConfig) -> None:
        # Fail before anything is served: unreadable keys, an admin API open to the network.
        self._keys: Keys | None = Keys.load(config)
        self._config = config
        self.epoch: ConfigEpoch  # built by start()
        timeouts = Timeouts.of(config.timeouts)
        self.upstreams = Upstreams(
            config.upstreams, timeouts, credentials=upstream_credentials(config)
        )
        self.metrics = Metrics()
        self.deps = LatencyDeps(
            upstreams=self.upstreams,
            timeouts=timeouts,
            spawn=self.spawn,
            metrics=self.metrics,
            facts=NodeFactsBook(),
        )
        self._tasks: set[asyncio.Task[None]] = set()  # cleanups
        self.kv_events = KvEventsHub()
        self.loops = BackgroundLoops(lambda: self.epoch, config, self.deps, self.kv_events)
        self._reloading = asyncio.Lock()
        self.draining = False  # set on SIGTERM: /ready fails, in-flight requests finish
        self.live = LiveResponses()  # answers being sent, for shutdown to wait for
        self.tenants = Tenants(config.tenants, make_limiter(config), self.metrics, self.spawn)

    @property
    def config(self) -> GatewayConfig:
        epoch = getattr(self, "epoch", None)
        return epoch.config if epoch is not None else self._config

    @property
    def gates(self) -> dict[str, Gate]:
        return self.epoch.gates

    async def start(self) -> None:
        """Everything `prepare` does, then start the background loops (the nodes found and
        probed before any request)."""
        await self.loops.start(await self.prepare())

    async def prepare(self) -> dict[str, Gate]:
        """Read everything the configuration names (tokenizers and chat templates, off the
        event loop; generation configs) and build each model's paths, contacting no
        backend: `pd-gateway check` runs this and stops. Returns the new pools, by model."""
        self.epoch, changes = await build_epoch(
            self._config, self.deps, keys=self._keys, kv_events=self.kv_events
        )
        self._keys = None  # a reload loads its own
        self.metrics.configuration_loaded(successful=True)
        return changes.new_gates

    async def reload(self, config: GatewayConfig | None = None) -> dict[str, str]:
        """Swap in `config` (by default the configuration file read again). Raises
        ConfigError, leaving everything as it was, if it cannot be used; else returns what
        changed per model."""
        async with self._reloading:
            current = self.epoch
            try:
                config, epoch, changes = await self._next_epoch(config, current)
            except ConfigError as exc:
                log.error("the configuration was not reloaded: %s", _one_line(exc))
                self.metrics.configuration_loaded(successful=False)
                raise
            except Exception as exc:
                # Whatever the new configuration broke, the running one serves on.
                message = f"{self.config.source}: {type(exc).__name__}: {_one_line(exc)}"
                log.error("the configuration was not reloaded: %s", message)
                self.metrics.configuration_loaded(successful=False)
                raise ConfigError(message) from None
            self.epoch = epoch
            self.tenants.reconfigured(config.tenants)
            if config.logging != current.config.logging:
                logs.configure(config.logging.level, config.logging.format)
            await self.loops.reloaded(changes)
            for gate in changes.dropped_gates.values():
                await gate.close()
            log.info("configuration reloaded from %s: %s", config.source, changes.models or "same")
            self.metrics.configuration_loaded(successful=True)
            freeze_heap()  # the new models' objects too, and the old ones collected
            return changes.models

    async def _next_epoch(
        self, config: GatewayConfig | None, current: ConfigEpoch
    ) -> tuple[GatewayConfig, ConfigEpoch, Changes]:
        """The epoch a reload would swap in; nothing running is touched yet."""
        if config is None:
            config = await asyncio.to_thread(load_config, self.config.source)
        for section in RESTART_ONLY:
            if getattr(config, section) != getattr(current.config, section):
                log.warning("reload: '%s' changes only on a restart; kept as it was", section)
        kept = {section: getattr(current.config, section) for section in RESTART_ONLY}
        config = config.model_copy(update=kept)
        epoch, changes = await build_epoch(
            config, self.deps, current, found=self.loops.found, kv_events=self.kv_events
        )
        return config, epoch, changes

    def node_facts(self, model: str) -> dict[str, dict[str, Any]]:
        """Each node of the model's pool: the TileRT release its pool expects, and what the
        node last reported (nothing yet: it has not answered, or runs another release)."""
        runtime = self.epoch.models[model]
        latency = runtime.config.latency
        nodes = self.loops.discovered_nodes(model)
        if nodes is None:
            nodes = configured_nodes(latency) if latency is not None else []
        out: dict[str, dict[str, Any]] = {}
        for node in nodes:
            facts = self.deps.facts.get(node.id)
            out[node.id] = {
                "expected": node.tilert,
                "tilert": facts.version if facts else None,
                "features": sorted(facts.features) if facts else [],
                "engine": facts.engine if facts else None,
            }
        return out

    async def pool_snapshots(self) -> dict[str, GateSnapshot]:
        return {name: await gate.snapshot() for name, gate in self.gates.items()}

    async def metrics_text(self) -> bytes:
        """Every metric, in the Prometheus text format."""
        sets, followed = self.epoch.server_sets(), self.kv_events.followed()
        return self.metrics.render(await self.pool_snapshots(), sets, followed, self.sizes())

    def sizes(self) -> dict[str, list[PoolSize]]:
        """Each model's pools with their recommended sizes (router/capacity)."""
        return {
            name: runtime.sizer.sizes(runtime.timings, tilert=runtime.gate is not None)
            for name, runtime in self.epoch.models.items()
        }

    def upstream_servers(self) -> dict[str, dict[str, dict[str, dict[str, object]]]]:
        """Each model's vLLM server sets, each server as its set sees it, with the load
        figures last read from it and the state of its KV-event index (if any)."""
        return {
            model: {servers.name: self._seen(servers) for servers in sets}
            for model, sets in self.epoch.server_sets().items()
        }

    def _seen(self, servers: ServerSet) -> dict[str, dict[str, object]]:
        figures = load_snapshot(servers)
        out: dict[str, dict[str, object]] = {}
        for url, seen in servers.snapshot().items():
            out[url] = {**seen, "load": figures[url]} if url in figures else dict(seen)
            if (index := self.kv_events.snapshot(url)) is not None:
                out[url]["kv_events"] = index
        return out

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

    async def discard(self) -> None:
        """After `prepare` alone (nothing started): let go of what it built, contacting no
        backend (a Redis pool is left to expire as a dead replica's would, holding nothing)."""
        await self.tenants.close()
        await self.upstreams.aclose()

    async def aclose(self) -> None:
        await self.loops.aclose()
        for model in self.epoch.models.values():
            if model.latency is not None:
                model.latency.close_all()
        if self._tasks:
            # The longest a cleanup can take: consume a transfer, or cancel then drain.
            t = self.deps.timeouts
            grace_s = max(t.kv_transfer_s + 5, t.cancel_s + t.decode_stall_s) + t.connect_s
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        for gate in self.gates.values():
            await gate.close()
        await self.tenants.close()
        await self.upstreams.aclose()


def freeze_heap() -> None:
    """Move everything alive now (modules, tokenizers, templates, the app: ~90k objects)
    out of the collector's sight. A full collection would otherwise walk all of it, ~25 ms
    with the event loop stopped, several times a minute under load; it now walks only what
    requests have made since. Done once serving, and after every reload."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
