"""A replica's upkeep of the shared pool: the leases it holds renewed (with its heartbeat)
and given back, and the waiters it gave up withdrawn from the queue, again and again while
Redis cannot be reached. Every clean-up runs to its end even if its caller is cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from router.config import RedisGateConfig
from router.gate.circuit_breaker import NodeFailure
from router.gate.events import GateEvents
from router.gate.redis.client import UNAVAILABLE
from router.gate.redis.lease import Grant, RedisLease
from router.gate.redis.scripts import Scripts
from router.node import Node

log = logging.getLogger("pd_gateway.gate")

_MAX_ORPHANS = 1024
LANDED_NEWS_S = 0.2
"""How soon after a request's transfer has landed the pool's state learns it (one renewal
for every landing of the moment): until then, a lease lost keeps a TileRT 0.1.5 node out
for the prefill's deadline, as if the transfer were still on its way."""


class Upkeep:
    def __init__(
        self,
        scripts: Scripts,
        config: RedisGateConfig,
        metrics: GateEvents,
        *,
        hand_over: Callable[[str, str, int], None],
    ) -> None:
        self._scripts = scripts
        self._hand_over = hand_over  # (owner, node id, token): a node for a waiter of ours
        self._config = config
        self._metrics = metrics
        self._leases: set[RedisLease] = set()
        # Given-up acquires not yet withdrawn from Redis, and the node each was granted if
        # known (a bounded number: the rest expire).
        self._orphans: dict[str, str] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._landed_news = asyncio.Event()

    def lease(self, node: Node, owner: str, holder: str, token: int) -> RedisLease:
        """A granted node's lease, renewed from now on until released or lost."""
        lease = RedisLease(
            Grant(node, owner, holder, token),
            valid_until=time.monotonic() + self._config.lease_ttl_s - self._config.socket_timeout_s,
            renew=self.renew,
            release=self.release,
            on_landed=self._landed_news.set,
        )
        self._leases.add(lease)
        self._metrics.granted("redis")
        return lease

    def holds(self, owner: str) -> bool:
        return any(lease.grant.owner == owner for lease in self._leases)

    async def release(
        self, lease: RedisLease, failure: NodeFailure | None, reports_health: bool
    ) -> None:
        self._leases.discard(lease)
        grant = lease.grant
        call = self._scripts.start(
            "release",
            touching=[grant.node.id],
            on_reply=self._hand_over_granted,  # the waiter needs no turn of this task's
            node=grant.node.id,
            owner=grant.owner,
            token=grant.token,
            reports_health="1" if reports_health else "0",
            reason="" if failure is None else failure.reason,
            hard="1" if failure is not None and failure.hard else "0",
        )
        try:
            released = bool(await call)
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

    def _hand_over_granted(self, reply: Any) -> None:
        """Hand the nodes a release granted to this replica's own waiters over to them
        (whether or not the releasing request is still there to see it)."""
        if not reply:
            return
        handed = reply[1:]
        for i in range(0, len(handed), 3):
            self._hand_over(handed[i], handed[i + 1], int(handed[i + 2]))

    async def renew(self, leases: list[RedisLease]) -> None:
        """Renew `leases` and this replica's heartbeat; a failure leaves each lease valid until
        its TTL would run out."""
        # A renewal may run twice: a failed one is sent again at once, on another connection
        # (one the server closed just as it was handed out fails its command).
        for attempt in (1, 2):
            sent_at = time.monotonic()
            try:
                held = await self._scripts.run(
                    "renew",
                    touching=[lease.node.id for lease in leases],
                    owners="\n".join(lease.grant.owner for lease in leases),
                    tokens="\n".join(str(lease.grant.token) for lease in leases),
                    landed="\n".join("1" if lease.landed else "0" for lease in leases),
                )
                break
            except UNAVAILABLE as exc:
                if attempt == 2:
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

    async def abandon(self, owner: str, node_id: str = "") -> None:
        """Out of the queue, passing on any node granted meanwhile (`node_id`, if the waiter
        knows one); runs to its end even if the waiter is cancelled again."""
        await asyncio.shield(self.spawn(self.withdraw(owner, node_id)))

    async def withdraw(self, owner: str, node_id: str = "") -> bool:
        """False if Redis could not be reached: retried by the renewer until it can."""
        touching = [node_id] if node_id else []
        try:
            await self._scripts.run("abandon", touching=touching, owner=owner, node=node_id)
        except UNAVAILABLE as exc:
            if owner not in self._orphans:
                log.warning("could not withdraw a waiter (retried by the renewer): %s", exc)
                self._orphans[owner] = node_id
                if len(self._orphans) > _MAX_ORPHANS:
                    del self._orphans[next(iter(self._orphans))]
            return False
        self._orphans.pop(owner, None)
        return True

    async def run(self, closing: asyncio.Event) -> None:
        """Every `renew_every_s`, or `LANDED_NEWS_S` after a transfer has landed, until
        `closing`: renew, then retry the withdrawals."""
        while not await self._until_due(closing):
            await self.renew(list(self._leases))
            await self.withdraw_orphans()

    async def _until_due(self, closing: asyncio.Event) -> bool:
        """Until the next renewal is due; whether `closing` is set."""
        news = self._landed_news
        waits = [asyncio.ensure_future(closing.wait()), asyncio.ensure_future(news.wait())]
        try:
            await asyncio.wait(
                waits, timeout=self._config.renew_every_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for wait in waits:
                wait.cancel()
        if news.is_set() and not closing.is_set():
            news.clear()
            await _set_within(closing, LANDED_NEWS_S)  # the landings of the moment, together
        return closing.is_set()

    async def withdraw_orphans(self) -> None:
        for owner, node_id in list(self._orphans.items()):
            if not await self.withdraw(owner, node_id):
                break  # still unreachable

    def spawn(self, call: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a clean-up as a task of its own, kept until it ends."""
        task = asyncio.ensure_future(call)
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    async def finish(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the clean-ups under way."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.debug("a gate clean-up failed: %s", exc)


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    """Pause for `seconds`, or less if `event` is set meanwhile; whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()
