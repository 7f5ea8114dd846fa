"""The gate's single-process backend: slots and the waiting queue in memory.

A freed slot is handed straight to the best waiter's future (no polling), so the next
request starts the moment the previous decode response ends.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from router.gate.base import (
    UNSHARED,
    GateRejected,
    GateSnapshot,
    ProbeClaim,
    RejectReason,
    Share,
)
from router.gate.circuit_breaker import NodeFailure, NodeHealth
from router.gate.events import UNRECORDED, GateEvents
from router.gate.fair_share import FairQueue, Hold, VirtualTime, Waiter, holding
from router.gate.hold_times import HoldTimeEstimator
from router.node import Node


@dataclass(order=True, slots=True)
class _Waiter(Waiter):
    future: asyncio.Future[Node] = field(kw_only=True, compare=False)


class MemoryLease:
    __slots__ = ("_acquired_at", "_gate", "_node", "_released", "holder", "share")

    def __init__(self, gate: MemoryGate, node: Node, holder: str, share: Share) -> None:
        self._gate = gate
        self._node = node
        self._acquired_at = time.monotonic()
        self._released = False
        self.holder = holder
        self.share = share

    @property
    def node(self) -> Node:
        return self._node

    @property
    def released(self) -> bool:
        return self._released

    async def release(
        self, failure: NodeFailure | None = None, *, reports_health: bool = True
    ) -> None:
        if not self._released:
            self._released = True
            held_s = time.monotonic() - self._acquired_at
            self._gate._release(
                self._node, held_s, self.share, failure, reports_health=reports_health
            )

    def valid(self) -> bool:
        return not self._released

    async def renew(self) -> bool:
        return not self._released  # one process: a held slot cannot be lost

    def transfer_landed(self) -> None:
        pass  # never lost while the process runs


class MemoryGate:
    def __init__(
        self,
        nodes: list[Node],
        *,
        max_queue: int,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
        metrics: GateEvents | None = None,
    ) -> None:
        self._metrics = metrics or UNRECORDED
        self._nodes = list(nodes)
        self._health = NodeHealth(
            (n.id for n in nodes), threshold=failure_threshold, cooldown_s=cooldown_s
        )
        self._free: deque[Node] = deque(nodes)
        self._holders: dict[str, str | None] = {n.id: None for n in nodes}
        self._waiters: FairQueue[_Waiter] = FairQueue()
        self._max_queue = max_queue
        self._arrivals = itertools.count()
        self._hold_times = HoldTimeEstimator()
        self._holds: dict[str, Hold] = {}  # node id -> its holder's share, since when
        self._virtual = VirtualTime()
        self._fair = False  # a request of another share than the default one has been seen
        self._leaving: set[str] = set()  # removed by a reload, still held

    @property
    def _waiting(self) -> int:
        return self._waiters.active

    async def acquire(
        self,
        *,
        priority: float,
        wait_s: float,
        holder: str,
        deadline_s: float | None = None,
        share: Share = UNSHARED,
    ) -> MemoryLease:
        tenant = share.tenant
        if share != UNSHARED:
            self._fair = True
        holds = self._holding()
        if self._fair and tenant not in holds:
            self._virtual.lift(tenant)
        may_hold = _below_cap(share, holds)
        # A node is free only while every waiter is at its cap (fair_share.py).
        if self._free and may_hold:
            if self._fair:
                self._virtual.served_at(self._virtual_of(tenant, holds))
            return self._grant(self._free.popleft(), holder, share)
        if self._health.expected == 0:
            raise GateRejected("no_node", self._retry_after_s())
        if self._waiting >= self._max_queue:
            raise GateRejected("queue_full", self._retry_after_s())
        if wait_s <= 0:
            reason: RejectReason = "pool_saturated" if may_hold else "tenant_max_nodes"
            raise GateRejected(reason, self._retry_after_s())
        due = time.monotonic() + (0.0 if deadline_s is None else deadline_s)
        waiter = _Waiter(
            (due, next(self._arrivals)),
            priority,
            share,
            holder,
            future=asyncio.get_running_loop().create_future(),
        )
        self._waiters.push(waiter)
        try:
            async with asyncio.timeout(wait_s):
                node = await waiter.future
        except TimeoutError:
            self._abandon(waiter)
            raise GateRejected("wait_timeout", self._retry_after_s()) from None
        except BaseException:
            self._abandon(waiter)
            raise
        return self._grant(node, holder, share)

    async def retry_after_s(self) -> int:
        return self._retry_after_s()

    async def expected_wait_s(self) -> float:
        if self._free and self._waiting == 0:
            return 0.0
        if self._health.in_service == 0:
            return math.inf
        return self._hold_times.expected_wait_s(
            waiting=self._waiting, nodes=self._health.in_service, held_for=self._held_for()
        )

    def _held_for(self) -> list[float]:
        now = time.monotonic()
        return [
            now - hold.since
            for node_id, hold in self._holds.items()
            if self._health.usable(node_id)
        ]

    def _holding(self) -> dict[str, tuple[int, float]]:
        """Per tenant, the nodes it holds and their weighted time (`fair_share.holding`);
        nothing to count while only the default share has been seen."""
        if not self._fair:
            return {}
        return holding(
            self._holds.values(), now=time.monotonic(), typical_s=self._hold_times.median_s
        )

    def _virtual_of(self, tenant: str, holds: dict[str, tuple[int, float]]) -> float:
        return self._virtual.of(tenant) + holds.get(tenant, (0, 0.0))[1]

    def _retry_after_s(self) -> int:
        if self._health.in_service == 0:
            return max(1, math.ceil(self._health.seconds_until_probe()) + 1)
        return self._hold_times.retry_after_s(
            waiting=self._waiting, nodes=self._health.in_service, held_for=self._held_for()
        )

    async def snapshot(self) -> GateSnapshot:
        return GateSnapshot(
            nodes=len(self._nodes),
            busy=dict(self._holders),
            out=self._health.out(),
            waiting=self._waiting,
            retry_after_s=self._retry_after_s(),
            hold_s=self._hold_times.mean_s,
        )

    async def due_for_probe(self) -> list[Node]:
        due = set(self._health.due_for_probe())
        return [n for n in self._nodes if n.id in due]

    async def nodes(self) -> list[Node]:
        return list(self._nodes)

    async def take_out(self, node_id: str, reason: str) -> None:
        if self._holders.get(node_id, "gone") is not None:
            return  # held or reserved (its release will judge it), or no longer in the pool
        self._health.record(node_id, NodeFailure(reason, hard=True))
        self._free = deque(n for n in self._free if n.id != node_id)
        self._fail_waiters_if_no_node()

    async def retire(self, node_id: str, reason: str) -> None:
        if node_id not in self._holders:
            return
        # Out now even if held: its holder finishes, and the node is not passed on after.
        self._health.take_out(node_id, reason)
        self._free = deque(n for n in self._free if n.id != node_id)
        self._fail_waiters_if_no_node()

    async def claim_for_probe(
        self, node_id: str, *, for_s: float, quiet_s: float = 0.0
    ) -> ProbeClaim | None:
        # One prober per pool in this process: nobody else flushes or readmits, and a lease
        # ends only by its release (never unreleased: no request's transfer is left stale).
        if self._holders.get(node_id, "gone") is not None:
            return None  # held (a node retired during its request), or not in the pool
        return ProbeClaim() if self._health.out().get(node_id, "drained") != "drained" else None

    async def release_probe_claim(self, node_id: str) -> None:
        pass  # nobody else could have claimed it meanwhile

    async def readmit(self, node_id: str) -> None:
        if node_id in self._holders and self._health.readmit(node_id):
            self._back_in_service(node_id)

    async def drain(self, node_id: str) -> bool:
        if node_id not in self._holders:
            return False
        self._health.drain(node_id)
        self._free = deque(n for n in self._free if n.id != node_id)
        self._fail_waiters_if_no_node()
        return True

    async def undrain(self, node_id: str) -> bool:
        if node_id not in self._holders:
            return False
        if self._health.undrain(node_id):
            self._back_in_service(node_id)
        return True

    async def set_nodes(self, nodes: list[Node]) -> None:
        wanted = {n.id: n for n in nodes}
        for node in nodes:
            known = next((i for i, n in enumerate(self._nodes) if n.id == node.id), None)
            if known is None:
                self._nodes.append(node)
                self._holders[node.id] = None
                self._health.add(node.id)
                self._hand_over(node)
                continue
            self._nodes[known] = node  # settings (ports) as configured now
            self._free = deque(node if n.id == node.id else n for n in self._free)
            if node.id in self._leaving:  # removed, then back before its request ended
                self._leaving.discard(node.id)
                self._health.undrain(node.id)
        for node in list(self._nodes):
            if node.id not in wanted and node.id not in self._leaving:
                self._health.drain(node.id)
                self._free = deque(n for n in self._free if n.id != node.id)
                if self._holders[node.id] is None:
                    self._forget(node.id)
                else:
                    self._leaving.add(node.id)
        self._fail_waiters_if_no_node()

    def _forget(self, node_id: str) -> None:
        self._leaving.discard(node_id)
        self._nodes = [n for n in self._nodes if n.id != node_id]
        self._holders.pop(node_id, None)
        self._holds.pop(node_id, None)
        self._health.remove(node_id)

    def _back_in_service(self, node_id: str) -> None:
        if self._health.usable(node_id) and self._holders[node_id] is None:
            self._hand_over(next(n for n in self._nodes if n.id == node_id))

    async def close(self) -> None:
        for waiter in self._waiters.drain():
            waiter.future.cancel()

    def _reserve(self, node: Node, holder: str, share: Share) -> None:
        """The node is the holder's from now (held by it, or handed over to it)."""
        self._holders[node.id] = holder
        self._holds[node.id] = Hold(share, time.monotonic())

    def _unreserve(self, node: Node) -> None:
        self._holders[node.id] = None
        self._holds.pop(node.id, None)

    def _grant(self, node: Node, holder: str, share: Share) -> MemoryLease:
        self._metrics.granted("memory")
        self._reserve(node, holder, share)  # held from now, not from its hand-over
        return MemoryLease(self, node, holder, share)

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gave up. If a node was handed to it in the meantime, pass that node on."""
        if waiter.active:
            self._waiters.discard(waiter)
            waiter.future.cancel()
        elif (
            waiter.future.done()
            and not waiter.future.cancelled()
            and waiter.future.exception() is None
        ):
            node = waiter.future.result()
            self._unreserve(node)
            self._pass_on(node)

    def _release(
        self,
        node: Node,
        held_s: float,
        share: Share,
        failure: NodeFailure | None,
        *,
        reports_health: bool,
    ) -> None:
        self._hold_times.observe(held_s)
        if self._fair:
            self._virtual.charge(share, held_s)
        self._unreserve(node)
        if reports_health:
            self._health.record(node.id, failure)
        self._pass_on(node)

    def _pass_on(self, node: Node) -> None:
        """A node just let go: to the next waiter if it is in service."""
        if node.id in self._leaving:
            self._forget(node.id)
            self._fail_waiters_if_no_node()
        elif self._health.usable(node.id):
            self._free.append(node)
        else:
            self._fail_waiters_if_no_node()
        self._fill()  # its holder's tenant may hold another node now

    def _fail_waiters_if_no_node(self) -> None:
        """With every node out of service for a reason that may last, waiting is pointless:
        reject the queue now."""
        if self._health.expected:
            return
        retry_after_s = self._retry_after_s()
        for waiter in self._waiters.drain():
            if not waiter.future.done():
                waiter.future.set_exception(GateRejected("no_node", retry_after_s))

    def _hand_over(self, node: Node) -> None:
        self._free.append(node)
        self._fill()

    def _fill(self) -> None:
        """Free nodes to the waiters the ordering policy picks (`fair_share.py`), while any
        may hold one more."""
        while self._free:
            holds = self._holding()
            waiter = self._waiters.pick(
                partial(_below_cap, holds=holds), partial(self._virtual_of, holds=holds)
            )
            if waiter is None:
                return
            if waiter.future.done():
                continue  # cancelled, its task not yet resumed: it will find nothing to pass on
            if self._fair:
                self._virtual.served_at(self._virtual_of(waiter.share.tenant, holds))
            node = self._free.popleft()
            self._reserve(node, waiter.holder, waiter.share)  # until the waiter's task resumes
            waiter.future.set_result(node)


def _below_cap(share: Share, holds: dict[str, tuple[int, float]]) -> bool:
    return share.max_nodes is None or holds.get(share.tenant, (0, 0.0))[0] < share.max_nodes
