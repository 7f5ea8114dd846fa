"""The gate's single-process backend: slots and the waiting queue in memory.

A freed slot is handed straight to the best waiter's future (no polling), so the next
request starts the moment the previous decode response ends.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass, field

from router.gate.base import GateRejected, GateSnapshot, ProbeClaim
from router.gate.circuit_breaker import NodeFailure, NodeHealth
from router.gate.events import UNRECORDED, GateEvents
from router.gate.hold_times import HoldTimeEstimator
from router.node import Node


@dataclass(order=True, slots=True)
class _Waiter:
    """`due` (monotonic): its deadline, for a waiter that must have its node by then (an
    objective), else when it arrived; `arrival` keeps equal ones first come, first served."""

    key: tuple[float, float, int]  # (-priority, due, arrival): heap order is service order
    future: asyncio.Future[Node] = field(compare=False)
    holder: str = field(compare=False)
    active: bool = field(default=True, compare=False)


class MemoryLease:
    __slots__ = ("_acquired_at", "_gate", "_node", "_released", "holder")

    def __init__(self, gate: MemoryGate, node: Node, holder: str) -> None:
        self._gate = gate
        self._node = node
        self._acquired_at = time.monotonic()
        self._released = False
        self.holder = holder

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
            self._gate._release(self._node, held_s, failure, reports_health=reports_health)

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
        self._waiters: list[_Waiter] = []
        self._waiting = 0
        self._stale = 0  # heap entries of waiters who gave up
        self._max_queue = max_queue
        self._arrivals = itertools.count()
        self._hold_times = HoldTimeEstimator()
        self._held_since: dict[str, float] = {}  # node id -> when its holder got it
        self._leaving: set[str] = set()  # removed by a reload, still held

    async def acquire(
        self, *, priority: float, wait_s: float, holder: str, deadline_s: float | None = None
    ) -> MemoryLease:
        if self._free and self._waiting == 0:
            return self._grant(self._free.popleft(), holder)
        if self._health.expected == 0:
            raise GateRejected("no_node", self._retry_after_s())
        if self._waiting >= self._max_queue:
            raise GateRejected("queue_full", self._retry_after_s())
        if wait_s <= 0:
            raise GateRejected("pool_saturated", self._retry_after_s())
        due = time.monotonic() + (0.0 if deadline_s is None else deadline_s)
        waiter = _Waiter(
            (-priority, due, next(self._arrivals)),
            asyncio.get_running_loop().create_future(),
            holder,
        )
        heapq.heappush(self._waiters, waiter)
        self._waiting += 1
        try:
            async with asyncio.timeout(wait_s):
                node = await waiter.future
        except TimeoutError:
            self._abandon(waiter)
            raise GateRejected("wait_timeout", self._retry_after_s()) from None
        except BaseException:
            self._abandon(waiter)
            raise
        return self._grant(node, holder)

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
            now - since
            for node_id, since in self._held_since.items()
            if self._health.usable(node_id)
        ]

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
        self._held_since.pop(node_id, None)
        self._health.remove(node_id)

    def _back_in_service(self, node_id: str) -> None:
        if self._health.usable(node_id) and self._holders[node_id] is None:
            self._hand_over(next(n for n in self._nodes if n.id == node_id))

    async def close(self) -> None:
        for waiter in self._waiters:
            if waiter.active:
                waiter.active = False
                self._waiting -= 1
                waiter.future.cancel()

    def _grant(self, node: Node, holder: str) -> MemoryLease:
        self._metrics.granted("memory")
        self._holders[node.id] = holder
        self._held_since[node.id] = time.monotonic()
        return MemoryLease(self, node, holder)

    def _abandon(self, waiter: _Waiter) -> None:
        """A waiter gave up. If a node was handed to it in the meantime, pass that node on."""
        if waiter.active:
            waiter.active = False
            self._waiting -= 1
            waiter.future.cancel()
            self._stale += 1
            if self._stale > 64 and self._stale * 2 > len(self._waiters):
                # Given-up entries stay in the heap until popped: rebuild it before they pile up.
                self._waiters = [w for w in self._waiters if w.active]
                heapq.heapify(self._waiters)
                self._stale = 0
        elif (
            waiter.future.done()
            and not waiter.future.cancelled()
            and waiter.future.exception() is None
        ):
            node = waiter.future.result()
            self._holders[node.id] = None
            self._pass_on(node)

    def _release(
        self, node: Node, held_s: float, failure: NodeFailure | None, *, reports_health: bool
    ) -> None:
        self._hold_times.observe(held_s)
        self._holders[node.id] = None
        self._held_since.pop(node.id, None)
        if reports_health:
            self._health.record(node.id, failure)
        self._pass_on(node)

    def _pass_on(self, node: Node) -> None:
        """A node just let go: to the next waiter if it is in service."""
        if node.id in self._leaving:
            self._forget(node.id)
            self._fail_waiters_if_no_node()
        elif self._health.usable(node.id):
            self._hand_over(node)
        else:
            self._fail_waiters_if_no_node()

    def _fail_waiters_if_no_node(self) -> None:
        """With every node out of service for a reason that may last, waiting is pointless:
        reject the queue now."""
        if self._health.expected:
            return
        for waiter in self._waiters:
            if waiter.active:
                waiter.active = False
                self._waiting -= 1
                if not waiter.future.done():
                    waiter.future.set_exception(GateRejected("no_node", self._retry_after_s()))
        self._waiters.clear()
        self._stale = 0

    def _hand_over(self, node: Node) -> None:
        while self._waiters:
            waiter = heapq.heappop(self._waiters)
            if not waiter.active:
                self._stale = max(0, self._stale - 1)
                continue
            waiter.active = False
            self._waiting -= 1
            if waiter.future.done():
                continue  # cancelled, its task not yet resumed: it will find nothing to pass on
            self._holders[node.id] = waiter.holder  # reserved until the waiter's task resumes
            waiter.future.set_result(node)
            return
        self._free.append(node)
