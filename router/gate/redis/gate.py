"""The gate's shared backend: every replica of the gateway sees one pool through one Redis.

A node is held through a lease (owner, fencing token, TTL) that the replica renews while
its request runs (`upkeep.py`); the waiting queue is one sorted set for all replicas, served
by priority, then earliest deadline, by the scripts in `lua/`, which hand a freed node
straight to the head of the queue. A waiter learns of its grant from a message on its
replica's channel, or failing that from its own bounded poll. If Redis cannot be reached,
`acquire` refuses with `gate_unavailable`: no node is ever handed out on a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Coroutine
from functools import partial
from typing import Any

from router.config import RedisGateConfig
from router.gate.base import UNSHARED, GateRejected, GateSnapshot, ProbeClaim, RejectReason, Share
from router.gate.events import UNRECORDED, GateEvents
from router.gate.redis.admin import RedisPoolAdmin
from router.gate.redis.client import UNAVAILABLE, connect
from router.gate.redis.keys import KeyLayout
from router.gate.redis.lease import RedisLease
from router.gate.redis.registry import NodeRegistry
from router.gate.redis.scripts import Scripts
from router.gate.redis.upkeep import Upkeep
from router.gate.redis.wakeups import WakeUps
from router.node import Node

log = logging.getLogger("pd_gateway.gate")

# Scores are doubles: priority (whole, or a half for a continuation) times 2^40 plus when the
# waiter is due (ms, lua/acquire.lua) must stay exact, and the due times queued together must
# differ by less than half a priority (2^39 ms, 17 years): each is at most _MAX_DUE_MS from
# the clock of the script that queued it, either way (about 25 days, beyond any wait).
_MAX_PRIORITY = 2047
_MAX_DUE_MS = 2**31
# Connections to Redis per replica (per node on a Cluster); the wake-up listener holds one,
# the node registry a few, and script calls wait their turn for the rest.
_MAX_CONNECTIONS = 32
_MAX_SCRIPT_CALLS = 24
_WAIT_FRESH_S = 0.05


class RedisGate:
    """`SlotGate` on the shared state, and the pool's `PoolAdmin` (`admin.py`) handed on:
    one instance per pool and replica."""

    def __init__(
        self,
        nodes: list[Node],
        *,
        config: RedisGateConfig,
        password: str | None,
        max_queue: int,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
        metrics: GateEvents | None = None,
        pool_id: str = "",
    ) -> None:
        metrics = metrics or UNRECORDED
        self._config = config
        self._max_queue = max_queue
        host = socket.gethostname().replace("|", "-")
        self.replica = f"{host}-{os.getpid()}-{secrets.token_hex(4)}"
        address = config.address
        self.keys = KeyLayout(config.key_prefix, cluster=address.deployment == "cluster")
        self.pool_keys = self.keys.pool(pool_id, [n.id for n in nodes])
        self._redis = connect(
            config,
            password,
            max_connections=_MAX_CONNECTIONS,
            reached=partial(metrics.redis_reached, address.deployment),
        )
        self._registry = NodeRegistry(self._redis, self.keys.nodes, metrics)
        self.scripts = Scripts(
            self._redis,
            layout=self.keys,
            pool=self.pool_keys,
            replica=self.replica,
            lease_ttl_s=config.lease_ttl_s,
            claim_window_s=config.claim_window_s,
            failure_threshold=failure_threshold,
            node_ids=[n.id for n in nodes],
            metrics=metrics,
            on_state_lost=self._state_lost,
            max_calls=_MAX_SCRIPT_CALLS,
        )
        self._upkeep = Upkeep(self.scripts, config, metrics, hand_over=self._hand_over)
        self._arrivals = itertools.count()
        self._waiters = WakeUps(
            self._redis,
            (self.keys.channel, self.keys.replica_channel(self.replica)),
            answer_s=config.socket_timeout_s,
            idle_s=config.renew_every_s,
            collect=self._collect,
            gone=self._pass_on,
        )
        self.admin = RedisPoolAdmin(
            nodes,
            scripts=self.scripts,
            registry=self._registry,
            config=config,
            failure_threshold=failure_threshold,
            cooldown_s=cooldown_s,
            waiting_here=lambda: len(self._waiters),
        )
        self._background: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()
        self._wait_s, self._wait_read_at = 0.0, -math.inf

    # -- SlotGate -----------------------------------------------------------------------

    async def acquire(
        self,
        *,
        priority: float,
        wait_s: float,
        holder: str,
        deadline_s: float | None = None,
        share: Share = UNSHARED,
    ) -> RedisLease:
        await self._start()
        self._wait_read_at = -math.inf  # the queue changes: the next prediction reads it
        # Fixed width: waiters due in the same millisecond are served in member order, which
        # is then this replica's arrival order.
        owner = f"{self.replica}|{next(self._arrivals):012d}"
        priority = max(-_MAX_PRIORITY, min(_MAX_PRIORITY, priority))
        due_ms = _due_ms(deadline_s)
        # Registered before it can be queued: a release of this replica's that grants it a
        # node right after the acquire script hands that node over here, not back.
        event = self._waiters.register(owner)
        try:
            return await self._acquire(
                owner, holder, _shared(share), priority, wait_s, due_ms, event
            )
        finally:
            self._waiters.unregister(owner)

    async def _acquire(
        self,
        owner: str,
        holder: str,
        share: str,
        priority: float,
        wait_s: float,
        due_ms: int,
        event: asyncio.Event,
    ) -> RedisLease:
        deadline = time.monotonic() + wait_s
        cancellations = _cancellations()
        try:
            reply = await _uncancelled(
                cancellations,
                self.scripts.run(
                    "acquire",
                    owner=owner,
                    holder=holder,
                    priority=priority,
                    wait_ms=int(wait_s * 1000),
                    due_ms=due_ms,
                    max_queue=self._max_queue,
                    share=share,
                ),
            )
        except UNAVAILABLE as exc:
            self._upkeep.spawn(self._upkeep.withdraw(owner))  # it may have run: give back
            raise self._rejected_unavailable(exc) from None
        except BaseException:
            await self._upkeep.abandon(owner)
            raise
        if reply[0] == "granted":
            try:
                return await self._granted(owner, holder, reply)
            except BaseException:
                await self._upkeep.abandon(owner)
                raise
        if reply[0] != "queued":
            raise GateRejected(_reason(reply[0]), await self.retry_after_s())
        return await self._wait(owner, holder, share, reply[1], deadline, cancellations, event)

    async def retry_after_s(self) -> int:
        try:
            state = await self.admin.state()
        except UNAVAILABLE:
            return self.admin.unavailable_retry_after_s()
        return state.retry_after_s()

    async def expected_wait_s(self) -> float:
        """Read from the pool's shared state at most every `_WAIT_FRESH_S` (and after each of
        this replica's acquires and grants): a prediction per request need not cost a script
        run each."""
        now = time.monotonic()
        if now - self._wait_read_at < _WAIT_FRESH_S:
            return self._wait_s
        try:
            await self._start()
            state = await self.admin.state()
        except (GateRejected, *UNAVAILABLE):  # closing, or Redis out of reach
            return math.inf
        self._wait_s, self._wait_read_at = state.expected_wait_s(), now
        return self._wait_s

    # -- PoolAdmin ----------------------------------------------------------------------

    async def snapshot(self) -> GateSnapshot:
        return await self.admin.snapshot()

    async def nodes(self) -> list[Node]:
        return await self.admin.nodes()

    async def due_for_probe(self) -> list[Node]:
        return await self.admin.due_for_probe()

    async def claim_for_probe(
        self, node_id: str, *, for_s: float, quiet_s: float = 0.0
    ) -> ProbeClaim | None:
        return await self.admin.claim_for_probe(node_id, for_s=for_s, quiet_s=quiet_s)

    async def release_probe_claim(self, node_id: str) -> None:
        await self.admin.release_probe_claim(node_id)

    async def readmit(self, node_id: str) -> None:
        await self.admin.readmit(node_id)

    async def take_out(self, node_id: str, reason: str) -> None:
        await self.admin.take_out(node_id, reason)

    async def retire(self, node_id: str, reason: str) -> None:
        await self.admin.retire(node_id, reason)

    async def drain(self, node_id: str) -> bool:
        return await self.admin.drain(node_id)

    async def undrain(self, node_id: str) -> bool:
        return await self.admin.undrain(node_id)

    async def set_nodes(self, nodes: list[Node]) -> None:
        await self.admin.set_nodes(nodes)

    async def close(self) -> None:
        """Reject this replica's waiters, take its entries out of the shared queue, stop the
        renewer and the listener, close the connections. Held leases may still be released
        afterwards (a new connection is opened for it); unreleased ones expire."""
        if self._closed:
            return
        self._closing.set()
        self._waiters.wake(["*"])
        with contextlib.suppress(TimeoutError):  # each waiter withdraws itself as it leaves
            async with asyncio.timeout(2 * self._config.socket_timeout_s):
                await self._waiters.until_none_waits()
        for task in self._background:
            task.cancel()
        if self._background:
            await asyncio.wait(self._background, timeout=self._config.poll_s)
        await self._upkeep.finish(self._config.poll_s)
        await self.scripts.settle(self._config.poll_s)
        await self._upkeep.finish(self._config.poll_s)  # what the last replies handed on
        self._background.clear()
        await self._upkeep.withdraw_orphans()
        try:
            await self.scripts.run("close")
        except UNAVAILABLE as exc:
            log.warning("could not withdraw this replica's waiters (they expire): %s", exc)
        await self._redis.aclose()

    # -- waiting ------------------------------------------------------------------------

    async def _wait(
        self,
        owner: str,
        holder: str,
        share: str,
        score: str,
        deadline: float,
        cancellations: int,
        event: asyncio.Event,
    ) -> RedisLease:
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                while not self._closed:
                    event.clear()
                    if (handed := self._waiters.handed(owner)) is not None:
                        return await self._granted(owner, holder, ["granted", *handed])
                    reply = await _uncancelled(
                        cancellations,
                        self.scripts.run(
                            "claim",
                            owner=owner,
                            holder=holder,
                            score=score,
                            remaining_ms=max(0, int((deadline - time.monotonic()) * 1000)),
                            share=share,
                        ),
                    )
                    if reply[0] == "granted":
                        return await self._granted(owner, holder, reply)
                    if reply[0] != "waiting":
                        raise GateRejected(_reason(reply[0]), await self.retry_after_s())
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._config.poll_s):
                            await event.wait()
                raise GateRejected("gate_unavailable", self.admin.unavailable_retry_after_s())
        except TimeoutError:
            await self._upkeep.abandon(owner)
            raise GateRejected("wait_timeout", await self.retry_after_s()) from None
        except UNAVAILABLE as exc:
            # Not waited for: Redis may be slow to answer.
            self._upkeep.spawn(self._upkeep.withdraw(owner))
            raise self._rejected_unavailable(exc) from None
        except BaseException:
            await self._upkeep.abandon(owner)
            raise

    async def _granted(self, owner: str, holder: str, reply: list[Any]) -> RedisLease:
        """The lease of a granted node. Another replica may have granted a node this one has
        not discovered yet: its settings come from the deployment's node registry."""
        self._wait_read_at = -math.inf
        node_id = reply[1]
        node = self.admin.known.get(node_id)
        if node is None:
            try:
                node = await self._registry.read(node_id)
            finally:
                if node is None:  # unknown, unreadable or unreachable: passed on
                    await self._upkeep.abandon(owner, node_id)
            if node is None:
                raise GateRejected("no_node", await self.retry_after_s())
            self.admin.known[node_id] = node
        return self._upkeep.lease(node, owner, holder, int(reply[2]))

    def _hand_over(self, owner: str, node_id: str, token: int) -> None:
        """A node this replica's release granted to one of its own waiters, or its collection
        claimed for one: given to the waiter at once, or, if it has left meanwhile, passed on
        to the next one. A waiter that has left holding it found it with a claim of its own
        that crossed the reply."""
        if not self._waiters.hand_over(owner, node_id, token) and not self._upkeep.holds(owner):
            self._upkeep.spawn(self._upkeep.withdraw(owner, node_id))

    def _collect(self, owners: list[str]) -> None:
        """Claim the nodes another replica's release granted to these waiters of ours, from
        the listener's turn: a waiter woken to claim for itself would take a turn more.
        Those left without a node (the grant had gone, Redis did not answer) are woken to
        look for themselves."""
        call = self.scripts.start(
            "collect", owners="\n".join(owners), on_reply=partial(self._collected, owners)
        )
        call.add_done_callback(partial(self._uncollected, owners))

    def _pass_on(self, owners: list[str]) -> None:
        """Owners of this replica named in a wake-up that neither wait here nor hold a node:
        a place left in the queue without its waiter (queued again by a claim that crossed
        its node's hand-over, docs/redis.md) would otherwise keep the node granted to it
        until the claim window ran out, and have this replica taken for dead. Its node goes
        to the next waiter now. (A withdrawal is harmless to one that has left already.)"""
        ours = f"{self.replica}|"
        for owner in owners:
            if owner.startswith(ours) and not self._upkeep.holds(owner):
                self._upkeep.spawn(self._upkeep.withdraw(owner))

    def _collected(self, owners: list[str], reply: list[Any]) -> None:
        claimed = set()
        for i in range(0, len(reply), 3):
            claimed.add(reply[i])
            self._hand_over(reply[i], reply[i + 1], int(reply[i + 2]))
        self._waiters.wake(owner for owner in owners if owner not in claimed)

    def _uncollected(self, owners: list[str], answer: asyncio.Future[Any]) -> None:
        if answer.cancelled() or answer.exception() is not None:
            self._waiters.wake(owners)

    # -- plumbing -----------------------------------------------------------------------

    async def _start(self) -> None:
        if self._closed:
            raise GateRejected("gate_unavailable", self.admin.unavailable_retry_after_s())
        if not self._background:
            self._background = [
                asyncio.create_task(self._upkeep.run(self._closing)),
                asyncio.create_task(
                    self._waiters.listen(backoff_s=self._config.poll_s, closing=self._closing)
                ),
            ]
            await self.admin.publish()
            # A release published before the subscription would be missed until the poll.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.socket_timeout_s):
                    await self._waiters.subscribed.wait()

    def _state_lost(self) -> None:
        log.warning("the pool's state in Redis was lost: nodes out until flushed")
        self._upkeep.spawn(self.admin.publish())

    @property
    def _closed(self) -> bool:
        return self._closing.is_set()

    def _rejected_unavailable(self, exc: BaseException) -> GateRejected:
        log.warning("gate state unreachable, request refused: %s", exc)
        return GateRejected("gate_unavailable", self.admin.unavailable_retry_after_s())


def _due_ms(deadline_s: float | None) -> int:
    """When a waiter is due, in ms from now: its deadline, or else now, its arrival (bounded
    by _MAX_DUE_MS)."""
    due_s = 0.0 if deadline_s is None else deadline_s
    return int(max(-_MAX_DUE_MS, min(_MAX_DUE_MS, due_s * 1000)))


def _shared(share: Share) -> str:
    """A waiter's share as the scripts store it: "" for the default one."""
    if share == UNSHARED:
        return ""
    cap = "" if share.max_nodes is None else str(share.max_nodes)
    return f"{share.tenant}|{share.weight!r}|{cap}"


def _reason(reply: str) -> RejectReason:
    reasons: dict[str, RejectReason] = {
        "queue_full": "queue_full",
        "wait_timeout": "wait_timeout",
        "pool_saturated": "pool_saturated",
        "tenant_max_nodes": "tenant_max_nodes",
        "no_node": "no_node",
    }
    return reasons.get(reply, "gate_unavailable")  # `gone`: the waiter had been withdrawn


async def _uncancelled(cancellations: int, call: Coroutine[Any, Any, Any]) -> Any:
    """A script call for a waiting request: a cancellation that arrived meanwhile is raised
    even if the client swallowed it (Python 3.11's wait_for does, when the call completes in
    the same turn)."""
    reply = await call
    if _cancellations() > cancellations:
        raise asyncio.CancelledError
    return reply


def _cancellations() -> int:
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def _loop_time(monotonic_deadline: float) -> float:
    """A time.monotonic() deadline on the event loop's clock."""
    return asyncio.get_running_loop().time() + (monotonic_deadline - time.monotonic())
