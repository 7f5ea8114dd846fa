"""TileRT nodes found by DNS: a pool's `discover` name (the headless Service of the nodes'
StatefulSet) resolved every `interval_s`, each address a node of the pool.

A node whose address appears joins the pool at once; one whose address is gone finishes its
request and leaves (the gate's `set_nodes`). A failed lookup changes nothing: a DNS blip
must not empty a pool.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from router.config import DiscoveryConfig, LatencyConfig
from router.gate.base import PoolAdmin
from router.node import Node, configured_nodes
from router.node_lifecycle.facts import NodeFactsBook

log = logging.getLogger("pd_gateway.discovery")

Resolve = Callable[[str, str], Awaitable[list[str]]]
"""(name, family) -> the name's addresses; raises OSError when the lookup fails."""

_FAMILIES = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6, "any": socket.AF_UNSPEC}


async def resolve_addresses(name: str, family: str) -> list[str]:
    """The addresses `name` resolves to (the system resolver, off the event loop)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, None, family=_FAMILIES[family], type=socket.SOCK_STREAM
    )
    return sorted({str(info[4][0]) for info in infos})


class Discovery:
    """Keeps one model's pool in step with its `discover` names.

    `latency` gives the model's current latency section (it changes on a reload)."""

    def __init__(
        self,
        model: str,
        latency: Callable[[], LatencyConfig | None],
        pool: PoolAdmin,
        facts: NodeFactsBook,
        resolve: Resolve = resolve_addresses,
    ) -> None:
        self._model = model
        self._latency = latency
        self.pool = pool
        self._facts = facts
        self._resolve = resolve
        self._found: dict[str, list[Node]] = {}  # pool name -> nodes found by DNS

    def found(self) -> list[Node]:
        """The nodes DNS gave for the pools that still discover."""
        latency = self._latency()
        pools = latency.pools if latency is not None else []
        return [node for p in pools if p.discover for node in self._found.get(p.name, [])]

    def nodes(self) -> list[Node]:
        """Every node of the model's pools: listed, then found."""
        latency = self._latency()
        listed = configured_nodes(latency) if latency is not None else []
        seen = {n.id for n in listed}
        return [*listed, *(n for n in self.found() if n.id not in seen)]

    async def refresh(self) -> bool:
        """Look every name up once; True if the pool changed (and was updated)."""
        latency = self._latency()
        changed = False
        for pool in latency.pools if latency is not None else []:
            if pool.discover is None:
                continue
            found = await self._lookup(pool.discover)
            if found is None:
                continue
            nodes = [
                Node(
                    host=address,
                    ctrl_port=pool.discover.ctrl_port,
                    http_port=pool.discover.http_port,
                    tilert=pool.tilert,
                    pool=pool.name,
                )
                for address in found
            ]
            if nodes != self._found.get(pool.name):
                before = {n.id for n in self._found.get(pool.name, [])}
                log.info(
                    "model %s, pool %s: nodes %s joined, %s left",
                    self._model,
                    pool.name,
                    sorted({n.id for n in nodes} - before) or "none",
                    sorted(before - {n.id for n in nodes}) or "none",
                )
                self._found[pool.name] = nodes
                changed = True
        if changed:
            nodes = self.nodes()
            await self.pool.set_nodes(nodes)
            self._facts.set_members(self._model, [n.id for n in nodes])
        return changed

    async def run_forever(self) -> None:
        """Refresh every (shortest) interval until cancelled."""
        while True:
            latency = self._latency()
            intervals = (
                [p.discover.interval_s for p in latency.pools if p.discover is not None]
                if latency is not None
                else []
            )
            await asyncio.sleep(min(intervals, default=10.0))
            try:
                await self.refresh()
            except Exception:  # nothing may end discovery: the pool would freeze as it is
                log.exception("discovering the nodes of model %s failed", self._model)

    async def _lookup(self, discover: DiscoveryConfig) -> list[str] | None:
        try:
            return await self._resolve(discover.dns, discover.family)
        except OSError as exc:
            log.warning("looking up %s failed (the pool stays as it is): %s", discover.dns, exc)
            return None
