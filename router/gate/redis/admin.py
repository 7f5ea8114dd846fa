"""`PoolAdmin` on the shared state: what the prober and operators see of one pool, and the
pool's membership in this replica (its nodes, those leaving it, every node it may hold)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from router.config import RedisGateConfig
from router.errors import GatewayError
from router.gate.base import GateSnapshot, ProbeClaim
from router.gate.redis.client import UNAVAILABLE
from router.gate.redis.pool_state import PoolState
from router.gate.redis.registry import NodeRegistry
from router.gate.redis.scripts import Scripts
from router.node import Node

log = logging.getLogger("pd_gateway.gate")


class GateUnavailable(GatewayError):
    """An operator's call could not reach the gate's shared state."""

    status = 503
    code = "gate_unavailable"


class RedisPoolAdmin:
    def __init__(
        self,
        nodes: list[Node],
        *,
        scripts: Scripts,
        registry: NodeRegistry,
        config: RedisGateConfig,
        failure_threshold: int,
        cooldown_s: float,
        waiting_here: Callable[[], int],
    ) -> None:
        # The pool, in grant order; nodes removed by a reload (maybe still held); every node
        # this replica may still hold a lease on.
        self._nodes = {n.id: n for n in nodes}
        self._leaving: dict[str, Node] = {}
        self.known = dict(self._nodes)
        self._scripts = scripts
        self._registry = registry
        self._config = config
        self._threshold = failure_threshold
        self._cooldown_s = cooldown_s
        self._waiting_here = waiting_here  # this replica's waiters, when Redis cannot say

    async def snapshot(self) -> GateSnapshot:
        try:
            state = await self.state()
        except UNAVAILABLE as exc:
            log.warning("gate state unreachable for a snapshot: %s", exc)
            return GateSnapshot(
                nodes=len(self._nodes),
                busy=dict.fromkeys(self._nodes),
                out=dict.fromkeys(self._nodes, "gate_unavailable"),
                waiting=self._waiting_here(),
                retry_after_s=self.unavailable_retry_after_s(),
            )
        return state.snapshot()

    async def nodes(self) -> list[Node]:
        return list(self._nodes.values())

    async def due_for_probe(self) -> list[Node]:
        try:
            state = await self.state()
        except UNAVAILABLE as exc:
            log.warning("gate state unreachable: no node probed this time: %s", exc)
            return []
        return [self._nodes[node_id] for node_id in state.health.due_for_probe()]

    async def claim_for_probe(
        self, node_id: str, *, for_s: float, quiet_s: float = 0.0
    ) -> ProbeClaim | None:
        if node_id not in self._nodes:
            return None
        try:
            reply = await self._admin(
                "claim", node_id, str(round(for_s * 1000)), quiet=round(quiet_s * 1000)
            )
        except UNAVAILABLE as exc:
            log.warning(
                "could not claim node %s for a probe: gate state unreachable: %s", node_id, exc
            )
            return None
        if not reply:
            return None
        return ProbeClaim(stale_rid=reply[1] or None)

    async def release_probe_claim(self, node_id: str) -> None:
        await self._change(node_id, "unclaim", strict=False)  # unreleased, it expires

    async def readmit(self, node_id: str) -> None:
        await self._change(node_id, "readmit", strict=False)

    async def take_out(self, node_id: str, reason: str) -> None:
        await self._change(node_id, "take_out", reason, strict=False)

    async def retire(self, node_id: str, reason: str) -> None:
        await self._change(node_id, "retire", reason, strict=False)

    async def drain(self, node_id: str) -> bool:
        return await self._change(node_id, "drain", strict=True)

    async def undrain(self, node_id: str) -> bool:
        return await self._change(node_id, "undrain", strict=True)

    async def set_nodes(self, nodes: list[Node]) -> None:
        """This replica's pool changes (other replicas change theirs on their own reload):
        a new node serves the queue at once; a removed one is no longer granted and leaves
        the snapshot once free. A node's shared state (lease, health) is kept throughout."""
        wanted = {n.id: n for n in nodes}
        self._leaving.update((i, n) for i, n in self._nodes.items() if i not in wanted)
        for node_id in wanted:
            self._leaving.pop(node_id, None)
        self._nodes = wanted
        self.known.update(wanted)
        self._scripts.node_ids = list(self._nodes)
        await self._registry.publish(nodes)
        try:
            await self._admin("pool")
        except UNAVAILABLE as exc:
            log.warning("gate state unreachable: new nodes serve from the next grant: %s", exc)

    async def publish(self) -> None:
        """Share the settings of this replica's nodes (again)."""
        await self._registry.publish(self._nodes.values())

    async def state(self) -> PoolState:
        """The pool's shared state; one of client.UNAVAILABLE if Redis cannot be reached."""
        leaving = list(self._leaving)
        state = PoolState.read(
            await self._scripts.run("state", touching=leaving),
            list(self._nodes),
            leaving,
            threshold=self._threshold,
            cooldown_s=self._cooldown_s,
        )
        for node_id in leaving:
            if node_id not in state.holders:  # its last request has ended: gone
                self._leaving.pop(node_id, None)
        return state

    def unavailable_retry_after_s(self) -> int:
        return max(1, math.ceil(self._config.lease_ttl_s))

    async def _admin(
        self, action: str, node_id: str = "", reason: str = "", *, quiet: int = 0
    ) -> Any:
        touching = [node_id] if node_id else []
        return await self._scripts.run(
            "admin", touching=touching, action=action, node=node_id, reason=reason, quiet=quiet
        )

    async def _change(self, node_id: str, action: str, reason: str = "", *, strict: bool) -> bool:
        if node_id not in self._nodes:
            return False
        try:
            await self._admin(action, node_id, reason)
        except UNAVAILABLE as exc:
            if strict:
                raise GateUnavailable(
                    f"the gate's shared state (Redis) is unreachable: cannot {action} {node_id}"
                ) from exc
            log.warning("could not %s node %s: gate state unreachable: %s", action, node_id, exc)
        return True
