"""The application's state: every shared object, built once at startup and closed at shutdown.

Grouped by lifetime: the process (upstream clients, metrics, the answers in flight,
background tasks: cleanups that outlive their request, and the node probers) and the
configuration (`epoch`: rules, keys and models, swapped whole on a reload).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Coroutine
from typing import Any

from router.config import ConfigError, GatewayConfig, LatencyConfig, load_config
from router.gate import Gate, GateSnapshot
from router.latency.protocol import LatencyDeps
from router.node import Node, configured_nodes
from router.nodes.discovery import Discovery
from router.nodes.facts import NodeFactsBook
from router.nodes.prober import admit_ready_nodes, probe_forever
from router.runtime.auth import Keys, upstream_credentials
from router.runtime.epoch import Changes, ConfigEpoch, build_epoch, check_tokenizer_files
from router.selection import KvEventsHub
from router.serving.live import LiveResponses
from router.telemetry import logs
from router.telemetry.metrics import Metrics
from router.upstream import Upstreams

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
        self.upstreams = Upstreams(
            config.upstreams, config.timeouts, credentials=upstream_credentials(config)
        )
        self.metrics = Metrics()
        self.deps = LatencyDeps(
            upstreams=self.upstreams,
            timeouts=config.timeouts,
            spawn=self.spawn,
            metrics=self.metrics,
            facts=NodeFactsBook(),
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._probers: dict[Gate, asyncio.Task[None]] = {}
        self._discoveries: dict[str, tuple[Discovery, asyncio.Task[None]]] = {}
        self.kv_events = KvEventsHub()  # followed by the app (router/http/app.py)
        self._reloading = asyncio.Lock()
        self.draining = False  # set on SIGTERM: /ready fails, in-flight requests finish
        self.live = LiveResponses()  # answers being sent, for shutdown to wait for

    @property
    def config(self) -> GatewayConfig:
        epoch = getattr(self, "epoch", None)
        return epoch.config if epoch is not None else self._config

    @property
    def gates(self) -> dict[str, Gate]:
        return self.epoch.gates

    async def start(self) -> None:
        """Everything `prepare` does, then find and probe the nodes."""
        new_gates = await self.prepare()
        await self._discover()
        await self._watch(new_gates)

    async def prepare(self) -> list[Gate]:
        """Read everything the configuration names (tokenizers and chat templates, off the
        event loop; generation configs) and build each model's paths, contacting no
        backend: `pd-gateway check` runs this and stops. Returns the new pools."""
        self.epoch, changes = await build_epoch(
            self._config, self.deps, keys=self._keys, kv_events=self.kv_events
        )
        self._keys = None  # a reload loads its own
        return list(changes.new_gates.values())

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
                raise
            except Exception as exc:
                # Whatever the new configuration broke, the running one serves on.
                message = f"{self.config.source}: {type(exc).__name__}: {_one_line(exc)}"
                log.error("the configuration was not reloaded: %s", message)
                raise ConfigError(message) from None
            self.epoch = epoch
            await self._discover()
            if config.logging != current.config.logging:
                logs.configure(config.logging.level, config.logging.format)
            await self._watch(changes.new_gates.values())
            for gate in changes.dropped_gates.values():
                prober = self._probers.pop(gate, None)
                if prober is not None:
                    prober.cancel()
                await gate.close()
            log.info("configuration reloaded from %s: %s", config.source, changes.models or "same")
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
            config, self.deps, current, found=self._found, kv_events=self.kv_events
        )
        return config, epoch, changes

    def _found(self, model: str) -> list[Node]:
        """The nodes DNS gave the model's pools (none without discovery)."""
        discovery = self._discoveries.get(model)
        return discovery[0].found() if discovery is not None else []

    def _latency_of(self, model: str) -> LatencyConfig | None:
        runtime = self.epoch.models.get(model)
        return runtime.config.latency if runtime is not None else None

    async def _discover(self) -> None:
        """Start discovery for the pools that name a DNS name (first lookup done before any
        request), and stop it where a reload removed it."""
        wanted = {
            name: gate
            for name, gate in self.gates.items()
            if (latency := self._latency_of(name)) is not None and latency.discovers
        }
        for name, (discovery, task) in list(self._discoveries.items()):
            if wanted.get(name) is not discovery.pool:
                task.cancel()
                del self._discoveries[name]
                self.deps.facts.members.pop(name, None)
        for name, gate in wanted.items():
            if name in self._discoveries:
                await self._discoveries[name][0].refresh()  # the reload may name new hosts
                continue
            discovery = Discovery(
                name, functools.partial(self._latency_of, name), gate, self.deps.facts
            )
            await discovery.refresh()
            self._discoveries[name] = (discovery, asyncio.create_task(discovery.run_forever()))

    async def _watch(self, gates: Any) -> None:
        """Probe new pools: nodes not ready start out of service, then are probed back."""
        gates, config, facts = list(gates), self.config.gate, self.deps.facts
        sole_user = config.backend == "memory"
        await asyncio.gather(
            *(
                admit_ready_nodes(g, self.upstreams, facts, self.metrics, sole_user=sole_user)
                for g in gates
            )
        )
        for gate in gates:
            self._probers[gate] = asyncio.create_task(
                probe_forever(
                    gate,
                    self.upstreams,
                    facts,
                    self.metrics,
                    interval_s=config.probe_interval_s,
                    facts_every_s=config.capabilities_interval_s,
                )
            )

    def node_facts(self, model: str) -> dict[str, dict[str, Any]]:
        """Each node of the model's pool: the TileRT release its pool expects, and what the
        node last reported (nothing yet: it has not answered, or runs another release)."""
        runtime = self.epoch.models[model]
        latency = runtime.config.latency
        nodes = configured_nodes(latency) if latency is not None else []
        if model in self._discoveries:
            nodes = self._discoveries[model][0].nodes()
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
        await self.upstreams.aclose()

    async def aclose(self) -> None:
        for prober in self._probers.values():
            prober.cancel()
        for _, task in self._discoveries.values():
            task.cancel()
        for model in self.epoch.models.values():
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
