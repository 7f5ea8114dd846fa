"""Every loop the gateway runs beside its requests, started and closed in one place.

For each TileRT pool: its node prober (facts, flush, readmission) and, where the pool names
a DNS name, its discovery. For the vLLM servers of every path: the health prober, the load
scraper and the KV-event follower. For every model: the readings its pools' sizing rests
on. The loops ask the current epoch for what to watch at every round, so a reload changes
what they watch without restarting them; only pools come and go with a reload, and
`reloaded` starts and stops theirs.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping

from router.capacity import READ_INTERVAL_S
from router.config import GatewayConfig, LatencyConfig
from router.gate import Gate
from router.latency.protocol import LatencyDeps
from router.node import Node
from router.node_lifecycle.discovery import Discovery
from router.node_lifecycle.prober import admit_ready_nodes, probe_pool_forever
from router.runtime.epoch import Changes, ConfigEpoch
from router.selection import (
    KvEventsHub,
    Load,
    ServerSet,
    Source,
    endpoint_of,
    parse_load,
    probe_servers_forever,
    scrape_forever,
)
from router.upstream import Upstreams, vllm

log = logging.getLogger("pd_gateway")


class BackgroundLoops:
    """The loops of one gateway process. `epoch` gives the current configuration's objects;
    `config` the configuration read at start-up (its `upstreams` and `gate` intervals change
    only on a restart)."""

    def __init__(
        self,
        epoch: Callable[[], ConfigEpoch],
        config: GatewayConfig,
        deps: LatencyDeps,
        kv_events: KvEventsHub,
    ) -> None:
        self._epoch = epoch
        self._config = config
        self._deps = deps
        self._kv_events = kv_events
        self._node_probers: dict[Gate, asyncio.Task[None]] = {}
        self._discoveries: dict[str, tuple[Discovery, asyncio.Task[None]]] = {}
        self._server_loops: list[asyncio.Task[None]] = []

    async def start(self, gates: Mapping[str, Gate]) -> None:
        """Find the pools' nodes (the first lookup done before any request), probe them,
        then watch the vLLM servers."""
        await self._discover()
        await self._watch_pools(gates)
        self._server_loops = [
            task
            for task in (
                self._probe_servers(),
                self._scrape_load(),
                self._follow_kv_events(),
                asyncio.create_task(self._read_load_forever(), name="pool sizing"),
            )
            if task is not None
        ]

    async def reloaded(self, changes: Changes) -> None:
        """A new epoch is current: discover and probe its new pools, stop the dropped ones'."""
        await self._discover()
        await self._watch_pools(changes.new_gates)
        dropped = [
            prober
            for gate in changes.dropped_gates.values()
            if (prober := self._node_probers.pop(gate, None)) is not None
        ]
        await _stopped(dropped)

    def found(self, model: str) -> list[Node]:
        """The nodes DNS gave the model's pools (none without discovery)."""
        discovery = self._discoveries.get(model)
        return discovery[0].found() if discovery is not None else []

    def discovered_nodes(self, model: str) -> list[Node] | None:
        """Every node of the model's pools, listed then found; None if it does not discover."""
        discovery = self._discoveries.get(model)
        return discovery[0].nodes() if discovery is not None else None

    async def aclose(self) -> None:
        tasks = [
            *self._node_probers.values(),
            *(task for _, task in self._discoveries.values()),
            *self._server_loops,
        ]
        self._node_probers.clear()
        self._discoveries.clear()
        self._server_loops = []
        await _stopped(tasks)

    # TileRT pools

    def _latency_of(self, model: str) -> LatencyConfig | None:
        runtime = self._epoch().models.get(model)
        return runtime.config.latency if runtime is not None else None

    async def _discover(self) -> None:
        """Start discovery for the pools that name a DNS name, and stop it where a reload
        removed it."""
        wanted = {
            name: gate
            for name, gate in self._epoch().gates.items()
            if (latency := self._latency_of(name)) is not None and latency.discovers
        }
        for name, (discovery, task) in list(self._discoveries.items()):
            if wanted.get(name) is not discovery.pool:
                task.cancel()
                del self._discoveries[name]
                self._deps.facts.members.pop(name, None)
        for name, gate in wanted.items():
            if name in self._discoveries:
                await self._discoveries[name][0].refresh()  # the reload may name new hosts
                continue
            discovery = Discovery(
                name, functools.partial(self._latency_of, name), gate, self._deps.facts
            )
            await discovery.refresh()
            task = asyncio.create_task(discovery.run_forever(), name=f"discovery {name}")
            self._discoveries[name] = (discovery, task)

    async def _watch_pools(self, gates: Mapping[str, Gate]) -> None:
        """Probe new pools: nodes not ready start out of service, then are probed back."""
        config, deps = self._config.gate, self._deps
        sole_user = config.backend == "memory"
        await asyncio.gather(
            *(
                admit_ready_nodes(g, deps.upstreams, deps.facts, deps.metrics, sole_user=sole_user)
                for g in gates.values()
            )
        )
        for model, gate in gates.items():
            self._node_probers[gate] = asyncio.create_task(
                probe_pool_forever(
                    gate,
                    deps.upstreams,
                    deps.facts,
                    deps.metrics,
                    model=model,
                    interval_s=config.probe_interval_s,
                    facts_every_s=config.capabilities_interval_s,
                ),
                name=f"node prober {model}",
            )

    # Pool sizing

    async def _read_load_forever(self) -> None:
        """Every `READ_INTERVAL_S`, each model's load for its pools' sizing."""
        while True:
            for name, runtime in self._epoch().models.items():
                try:
                    await runtime.read_load()
                except Exception:
                    log.exception("reading the load of %s for its sizing failed", name)
            await asyncio.sleep(READ_INTERVAL_S)

    # vLLM servers

    def _every_set(self) -> list[ServerSet]:
        return [servers for sets in self._epoch().server_sets().values() for servers in sets]

    def _probe_servers(self) -> asyncio.Task[None] | None:
        interval_s = self._config.upstreams.probe_interval_s
        if interval_s <= 0:
            return None
        upstreams = self._deps.upstreams

        async def answers(url: str) -> bool:
            return await vllm.answers_health(upstreams, url)

        return asyncio.create_task(
            probe_servers_forever(self._every_set, answers, interval_s=interval_s),
            name="server prober",
        )

    def _scrape_load(self) -> asyncio.Task[None] | None:
        interval_s = self._config.upstreams.load_interval_s
        if interval_s <= 0:
            return None
        read = functools.partial(server_load, self._deps.upstreams)
        return asyncio.create_task(
            scrape_forever(self._every_set, read, interval_s=interval_s), name="load scraper"
        )

    def _follow_kv_events(self) -> asyncio.Task[None]:
        """Follow the KV-cache events of the servers of every model whose prefix index is
        `kv_events` (of its sets that choose by prefix: more than one server)."""

        def wanted() -> dict[str, Source]:
            epoch = self._epoch()
            sources: dict[str, Source] = {}
            for name, sets in epoch.server_sets().items():
                selection = epoch.models[name].config.selection
                if not selection.prefix_affinity or selection.prefix_index != "kv_events":
                    continue
                events = selection.kv_events
                for servers in sets:
                    if not servers.request_aware:
                        continue
                    for url in servers.urls:
                        where = endpoint_of(url, port=events.port, endpoints=events.endpoints)
                        sources.setdefault(url, Source(where, events.topic, selection.block_size))
            return sources

        return asyncio.create_task(self._kv_events.follow_forever(wanted), name="kv events")


async def _stopped(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel `tasks` and wait until they have ended."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


async def server_load(upstreams: Upstreams, url: str) -> Load | None:
    """What a vLLM server's `/metrics` says of its load (None: it says nothing of it)."""
    text = await vllm.metrics_text(upstreams, url)
    return None if text is None else parse_load(text)
