"""The gate's shared backend: every replica of the gateway sees one pool through one Redis.

A node is held through a lease (owner, fencing token, TTL) that the replica renews while
its request runs; the waiting queue is one sorted set for all replicas, served in priority
then arrival order by the scripts in `scripts.py`, which hand a freed node straight to the
head of the queue. A waiter learns of its grant from a message on the deployment's channel,
or failing that from its own bounded poll. If Redis cannot be reached, `acquire` refuses with
`gate_unavailable`: no node is ever handed out on a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Coroutine
from typing import Any

import orjson
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError, ResponseError

from router.config import RedisGateConfig
from router.errors import GatewayError
from router.gate.base import GateRejected, GateSnapshot, RejectReason
from router.gate.health import NodeFailure
from router.gate.metrics import GateMetrics
from router.gate.redis.lease import Grant, RedisLease
from router.gate.redis.picture import Picture
from router.gate.redis.scripts import SCRIPTS
from router.gate.redis.wakeups import WakeUps
from router.node import Node

log = logging.getLogger("pd_gateway.gate")

UNAVAILABLE = (RedisError, OSError)
_EPOCH_RETRIES = 3
# Scores are doubles: priority times 2^40 plus an arrival count must stay exact.
_MAX_PRIORITY = 2047
_MAX_ORPHANS = 1024
# Connections to Redis per replica (the wake-up listener holds one of them).
_MAX_CONNECTIONS = 32


class GateUnavailable(GatewayError):
    """An operator's call could not reach the gate's shared state."""

    status = 503
    code = "gate_unavailable"


class RedisGate:
    def __init__(
        self,
        nodes: list[Node],
        *,
        config: RedisGateConfig,
        password: str | None,
        max_queue: int,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
        metrics: GateMetrics | None = None,
        pool_id: str = "",
    ) -> None:
        self._metrics = metrics or GateMetrics()
        self._nodes = {n.id: n for n in nodes}  # the pool, in grant order
        self._leaving: dict[str, Node] = {}  # removed by a reload, maybe still held
        self._known = dict(self._nodes)  # every node this gate may still hold a lease on
        self._config = config
        self._max_queue = max_queue
        self._threshold = failure_threshold
        self._cooldown_s = cooldown_s
        host = socket.gethostname().replace("|", "-")
        self.replica = f"{host}-{os.getpid()}-{secrets.token_hex(4)}"
        # The pool's identity across replicas: the model it serves and its listed nodes (a
        # node found by discovery joins a pool without changing it).
        listed = "\n".join([pool_id, *sorted(self._nodes)])
        pool = hashlib.sha256(listed.encode()).hexdigest()[:16]
        self._nodes_key = f"{config.key_prefix}:nodecfg"
        self._queue_key = f"{config.key_prefix}:pool:{pool}:queue"
        self._common: list[str | int] = [
            config.key_prefix,
            math.ceil(config.lease_ttl_s * 1000),
            failure_threshold,
            "\n".join(self._nodes),
            self.replica,
            "",  # the pool's state epoch, learnt from the first script's EPOCH answer
        ]
        # A bounded pool that makes a call wait for a connection (at most a socket timeout)
        # rather than fail: redis-py's default pool refuses past 100 connections in use, which
        # a replica with that many waiters polling at once would reach with Redis up.
        connections = BlockingConnectionPool.from_url(
            config.url,
            max_connections=_MAX_CONNECTIONS,
            timeout=config.socket_timeout_s,
            password=password,
            socket_timeout=config.socket_timeout_s,
            socket_connect_timeout=config.socket_timeout_s,
            retry=Retry(NoBackoff(), 0),  # a script is not retried blindly: it may have run
            decode_responses=True,
        )
        self._redis = Redis.from_pool(connections)
        self._scripts: dict[str, AsyncScript] = {
            name: self._redis.register_script(source) for name, source in SCRIPTS.items()
        }
        self._arrivals = itertools.count()
        self._waiters = WakeUps(
            self._redis,
            f"{config.key_prefix}:wake",
            answer_s=config.socket_timeout_s,
            idle_s=config.renew_every_s,
        )
        self._leases: set[RedisLease] = set()
        self._background: list[asyncio.Task[None]] = []
        self._cleanups: set[asyncio.Task[Any]] = set()
        # Given-up acquires not yet withdrawn from Redis (a bounded number: the rest expire).
        self._orphans: dict[str, None] = {}
        self._closing = asyncio.Event()

    # -- SlotGate -----------------------------------------------------------------------

    async def acquire(self, *, priority: int, wait_s: float, holder: str) -> RedisLease:
        await self._start()
        owner = f"{self.replica}|{next(self._arrivals)}"
        deadline = time.monotonic() + wait_s
        cancellations = _cancellations()
        priority = max(-_MAX_PRIORITY, min(_MAX_PRIORITY, priority))
        wait_ms = int(wait_s * 1000)
        try:
            reply = await self._run_for(
                cancellations, "acquire", owner, holder, priority, wait_ms, self._max_queue
            )
        except UNAVAILABLE as exc:
            self._spawn(self._withdraw(owner))  # it may have run: give back what it gave
            raise self._rejected_unavailable(exc) from None
        except BaseException:
            await self._abandon(owner)
            raise
        if reply[0] == "granted":
            try:
                return await self._granted(owner, holder, reply)
            except BaseException:
                await self._abandon(owner)
                raise
        if reply[0] != "queued":
            raise GateRejected(_reason(reply[0]), await self.retry_after_s())
        return await self._wait(owner, holder, reply[1], deadline, cancellations)

    async def retry_after_s(self) -> int:
        try:
            picture = await self._picture()
        except UNAVAILABLE:
            return self._unavailable_retry_after_s()
        return picture.retry_after_s()

    # -- PoolAdmin ----------------------------------------------------------------------

    async def snapshot(self) -> GateSnapshot:
        try:
            picture = await self._picture()
        except UNAVAILABLE as exc:
            log.warning("gate state unreachable for a snapshot: %s", exc)
            return GateSnapshot(
                nodes=len(self._nodes),
                busy=dict.fromkeys(self._nodes),
                out=dict.fromkeys(self._nodes, "gate_unavailable"),
                waiting=len(self._waiters),
                retry_after_s=self._unavailable_retry_after_s(),
            )
        return picture.snapshot()

    async def nodes(self) -> list[Node]:
        return list(self._nodes.values())

    async def due_for_probe(self) -> list[Node]:
        try:
            picture = await self._picture()
        except UNAVAILABLE as exc:
            log.warning("gate state unreachable: no node probed this time: %s", exc)
            return []
        return [self._nodes[node_id] for node_id in picture.health.due_for_probe()]

    async def claim_for_probe(self, node_id: str, *, for_s: float) -> bool:
        if node_id not in self._nodes:
            return False
        try:
            return bool(await self._run("admin", "claim", node_id, str(round(for_s * 1000))))
        except UNAVAILABLE as exc:
            log.warning(
                "could not claim node %s for a probe: gate state unreachable: %s", node_id, exc
            )
            return False

    async def readmit(self, node_id: str) -> None:
        await self._change(node_id, "readmit", strict=False)

    async def take_out(self, node_id: str, reason: str) -> None:
        await self._change(node_id, "take_out", reason, strict=False)

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
        self._known.update(wanted)
        self._common[3] = "\n".join(self._nodes)
        await self._publish_nodes(nodes)
        try:
            await self._run("admin", "pool", "", "")
        except UNAVAILABLE as exc:
            log.warning("gate state unreachable: new nodes serve from the next grant: %s", exc)

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
        if pending := [*self._background, *self._cleanups]:
            await asyncio.wait(pending, timeout=self._config.poll_s)
        self._background.clear()
        for owner in list(self._orphans):
            if not await self._withdraw(owner):
                break
        try:
            await self._run("close")
        except UNAVAILABLE as exc:
            log.warning("could not withdraw this replica's waiters (they expire): %s", exc)
        await self._redis.aclose()

    # -- waiting ------------------------------------------------------------------------

    async def _wait(
        self, owner: str, holder: str, score: str, deadline: float, cancellations: int
    ) -> RedisLease:
        event = self._waiters.register(owner)
        try:
            async with asyncio.timeout_at(_loop_time(deadline)):
                while not self._closed:
                    event.clear()
                    remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
                    reply = await self._run_for(
                        cancellations, "claim", owner, holder, score, remaining_ms
                    )
                    if reply[0] == "granted":
                        return await self._granted(owner, holder, reply)
                    if reply[0] != "waiting":
                        raise GateRejected(_reason(reply[0]), await self.retry_after_s())
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self._config.poll_s):
                            await event.wait()
                raise GateRejected("gate_unavailable", self._unavailable_retry_after_s())
        except TimeoutError:
            await self._abandon(owner)
            raise GateRejected("wait_timeout", await self.retry_after_s()) from None
        except UNAVAILABLE as exc:
            self._spawn(self._withdraw(owner))  # not waited for: Redis may be slow to answer
            raise self._rejected_unavailable(exc) from None
        except BaseException:
            await self._abandon(owner)
            raise
        finally:
            self._waiters.unregister(owner)

    async def _abandon(self, owner: str) -> None:
        """Out of the queue, passing on any node granted meanwhile; runs to its end even if
        the waiter is cancelled again."""
        await asyncio.shield(self._spawn(self._withdraw(owner)))

    async def _withdraw(self, owner: str) -> bool:
        try:
            await self._run("abandon", owner)
        except UNAVAILABLE as exc:
            if owner not in self._orphans:
                log.warning("could not withdraw a waiter (retried by the renewer): %s", exc)
                self._orphans[owner] = None
                if len(self._orphans) > _MAX_ORPHANS:
                    del self._orphans[next(iter(self._orphans))]
            return False
        self._orphans.pop(owner, None)
        return True

    async def _granted(self, owner: str, holder: str, reply: list[Any]) -> RedisLease:
        """The lease of a granted node. Another replica may have granted a node this one has
        not discovered yet: its settings come from the pool's shared node registry."""
        node_id = reply[1]
        node = self._known.get(node_id)
        if node is None:
            raw = await self._redis.hget(self._nodes_key, node_id)
            if raw is None:
                raise GateRejected("no_node", await self.retry_after_s())
            node = self._known[node_id] = Node(**orjson.loads(raw))
        lease = RedisLease(
            Grant(node, owner, holder, int(reply[2])),
            valid_until=time.monotonic() + self._config.lease_ttl_s - self._config.socket_timeout_s,
            renew=self._renew,
            release=self._release,
        )
        self._leases.add(lease)
        self._metrics.granted("redis")
        return lease

    # -- leases -------------------------------------------------------------------------

    async def _release(self, lease: RedisLease, failure: NodeFailure | None, judged: bool) -> None:
        self._leases.discard(lease)
        grant = lease.grant
        call = self._run(
            "release",
            grant.node.id,
            grant.owner,
            grant.token,
            "1" if judged else "0",
            "" if failure is None else failure.reason,
            "1" if failure is not None and failure.hard else "0",
        )
        try:
            released = await asyncio.shield(self._spawn(call))
        except UNAVAILABLE as exc:
            log.warning(
                "could not release node %s (%s): it frees itself when its lease expires",
                grant.node.id,
                exc,
            )
            return
        if not released:
            self._metrics.fencing_rejected()
            log.warning("node %s: the lease of %s had been lost", grant.node.id, grant.holder)

    async def _renew(self, leases: list[RedisLease]) -> None:
        """Renew `leases` and this replica's heartbeat; a failure leaves each lease valid until
        its TTL would run out."""
        args = [a for lease in leases for a in _lease_args(lease.grant)]
        sent_at = time.monotonic()
        try:
            held = await self._run("renew", *args)
        except UNAVAILABLE as exc:
            self._metrics.renewal_failed(len(leases))
            log.warning("could not renew %d node lease(s): %s", len(leases), exc)
            return
        self._metrics.renewed(sum(1 for ok in held if ok))
        for lease, ok in zip(leases, held, strict=True):
            if lease.released:
                continue  # given back while the renewal was on its way: not lost, just gone
            lease.renewed(sent_at=sent_at, ttl_s=self._config.lease_ttl_s, held=bool(ok))
            if not ok:
                self._metrics.expired()
                self._leases.discard(lease)
                log.warning("node %s: lease of %s lost", lease.node.id, lease.holder)

    async def _renew_forever(self) -> None:
        while not await self._closed_within(self._config.renew_every_s):
            await self._renew(list(self._leases))
            for owner in list(self._orphans):
                if not await self._withdraw(owner):
                    break  # still unreachable

    # -- plumbing -----------------------------------------------------------------------

    async def _start(self) -> None:
        if self._closed:
            raise GateRejected("gate_unavailable", self._unavailable_retry_after_s())
        if not self._background:
            self._background = [
                asyncio.create_task(self._renew_forever()),
                asyncio.create_task(
                    self._waiters.listen(backoff_s=self._config.poll_s, closing=self._closing)
                ),
            ]
            await self._publish_nodes(list(self._nodes.values()))
            # A release published before the subscription would be missed until the poll.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.socket_timeout_s):
                    await self._waiters.subscribed.wait()

    async def _publish_nodes(self, nodes: list[Node]) -> None:
        """Every replica may grant any node of the pool to any other: each one's settings
        are kept where all can read them."""
        if not nodes:
            return
        try:
            await self._redis.hset(self._nodes_key, mapping={n.id: orjson.dumps(n) for n in nodes})
        except UNAVAILABLE as exc:
            log.warning("could not share this pool's node settings: %s", exc)

    @property
    def _closed(self) -> bool:
        return self._closing.is_set()

    async def _closed_within(self, seconds: float) -> bool:
        """Pause for `seconds`, or less if the gate closes meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._closing.wait()
        return self._closed

    async def _run(self, script: str, *args: str | int) -> Any:
        for _ in range(_EPOCH_RETRIES):
            sent_at = time.perf_counter()
            try:
                reply = await self._scripts[script](
                    keys=[self._queue_key], args=[*self._common, *args]
                )
            except ResponseError as exc:
                epoch = str(exc).removeprefix("EPOCH ")
                if epoch == str(exc):
                    raise
                if self._common[5]:
                    log.warning("the pool's state in Redis was lost: nodes out until flushed")
                    self._spawn(self._publish_nodes(list(self._nodes.values())))
                self._common[5] = epoch  # the script did nothing else: run it again
                continue
            finally:
                self._metrics.round_trip(script, time.perf_counter() - sent_at)
            return reply
        raise ResponseError("the pool's state epoch keeps changing")

    async def _run_for(self, cancellations: int, script: str, *args: str | int) -> Any:
        """`_run` for a waiting request: a cancellation that arrived meanwhile is raised even
        if the client swallowed it (Python 3.11's wait_for does, when the call completes in
        the same turn)."""
        reply = await self._run(script, *args)
        if _cancellations() > cancellations:
            raise asyncio.CancelledError
        return reply

    def _spawn(self, call: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(call)
        self._cleanups.add(task)
        task.add_done_callback(self._cleaned_up)
        return task

    def _cleaned_up(self, task: asyncio.Task[Any]) -> None:
        self._cleanups.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("a gate clean-up failed: %s", exc)

    async def _change(self, node_id: str, action: str, reason: str = "", *, strict: bool) -> bool:
        if node_id not in self._nodes:
            return False
        try:
            await self._run("admin", action, node_id, reason)
        except UNAVAILABLE as exc:
            if strict:
                raise GateUnavailable(
                    f"the gate's shared state (Redis) is unreachable: cannot {action} {node_id}"
                ) from exc
            log.warning("could not %s node %s: gate state unreachable: %s", action, node_id, exc)
        return True

    async def _picture(self) -> Picture:
        leaving = list(self._leaving)
        picture = Picture.read(
            await self._run("state", *leaving),
            list(self._nodes),
            leaving,
            threshold=self._threshold,
            cooldown_s=self._cooldown_s,
        )
        for node_id in leaving:
            if node_id not in picture.holders:  # its last request has ended: gone
                self._leaving.pop(node_id, None)
        return picture

    def _unavailable_retry_after_s(self) -> int:
        return max(1, math.ceil(self._config.lease_ttl_s))

    def _rejected_unavailable(self, exc: BaseException) -> GateRejected:
        log.warning("gate state unreachable, request refused: %s", exc)
        return GateRejected("gate_unavailable", self._unavailable_retry_after_s())


def _reason(reply: str) -> RejectReason:
    reasons: dict[str, RejectReason] = {
        "queue_full": "queue_full",
        "wait_timeout": "wait_timeout",
        "pool_saturated": "pool_saturated",
        "no_node": "no_node",
    }
    return reasons.get(reply, "gate_unavailable")  # `gone`: the waiter had been withdrawn


def _lease_args(grant: Grant) -> tuple[str, str, int]:
    return grant.node.id, grant.owner, grant.token


def _cancellations() -> int:
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


def _loop_time(monotonic_deadline: float) -> float:
    """A time.monotonic() deadline on the event loop's clock."""
    return asyncio.get_running_loop().time() + (monotonic_deadline - time.monotonic())
