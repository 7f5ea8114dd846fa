"""Wake-ups for one replica's waiters: the scripts publish the owners they granted a node
to on the replica's own channel (on the deployment's, for a replica not heard on its own),
and `*` (everyone must look again) on the deployment's. The listener hears both; it hands
its own waiters named to `collect`, which claims their nodes for them, and those named that
wait here no more to `gone`, which passes their nodes on; `*` sets every waiter's event. A
lost message only delays a waiter until its own bounded poll. A node that this replica's
own release or collection claimed for one of its waiters is given to the waiter here
(`hand_over`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from redis.asyncio.client import PubSub

from router.gate.redis.client import CONNECTION_LOST, GateRedis

log = logging.getLogger("pd_gateway.gate")

RECONNECT_FIRST_S = 0.05
"""The wait before subscribing again after the first failure in a row."""


class WakeUps:
    def __init__(
        self,
        redis: GateRedis,
        channels: tuple[str, ...],
        *,
        answer_s: float,
        idle_s: float,
        collect: Callable[[list[str]], None],
        gone: Callable[[list[str]], None],
    ) -> None:
        self._redis = redis
        self._channels = channels  # the deployment's, and the replica's own
        self._collect = collect  # claims the nodes granted to these waiters of ours
        self._gone = gone  # passes on what was granted to these, which wait here no more
        self._answer_s = answer_s  # how long the server may take to confirm a subscription
        self._idle_s = idle_s  # after this long without a message, ping the connection
        self._events: dict[str, asyncio.Event] = {}  # owner -> set when it should look
        self._handed: dict[str, tuple[str, int]] = {}  # owner -> (node id, token) it holds
        self._left = asyncio.Event()
        self.subscribed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._events)

    def register(self, owner: str) -> asyncio.Event:
        self._events[owner] = asyncio.Event()
        return self._events[owner]

    def unregister(self, owner: str) -> None:
        del self._events[owner]
        self._handed.pop(owner, None)
        self._left.set()

    def hand_over(self, owner: str, node_id: str, token: int) -> bool:
        """Give a waiter the node its replica claimed for it; False if it no longer waits
        here (the caller then passes the node on)."""
        event = self._events.get(owner)
        if event is None:
            return False
        self._handed[owner] = (node_id, token)
        event.set()
        return True

    def handed(self, owner: str) -> tuple[str, int] | None:
        """The node handed over to `owner`, once."""
        return self._handed.pop(owner, None)

    def wake(self, owners: Iterable[str]) -> None:
        owners = list(owners)
        for owner in self._events if "*" in owners else owners:
            if (event := self._events.get(owner)) is not None:
                event.set()

    async def until_none_waits(self) -> None:
        while self._events:
            self._left.clear()
            await self._left.wait()

    async def listen(self, *, backoff_s: float, closing: asyncio.Event) -> None:
        """Until `closing` is set, reconnecting after a failure: at once, then twice as long
        after each failure in a row, `backoff_s` apart at most (a connection lost to a busy
        moment is back before the waiters' next poll; an unreachable server is not
        hammered). Each (re)subscription wakes every waiter, as a message may have been
        missed meanwhile."""
        wait_s = min(RECONNECT_FIRST_S, backoff_s)
        while not closing.is_set():
            pubsub: PubSub | None = None
            try:
                pubsub = await self._redis.pubsub()
                await self._subscribe(pubsub)
                self.subscribed.set()
                wait_s = min(RECONNECT_FIRST_S, backoff_s)
                self.wake(["*"])
                while not closing.is_set():
                    message = await pubsub.get_message(timeout=self._idle_s)
                    if message is None:
                        await pubsub.ping()  # idle for a while: is the connection still there?
                    elif message["type"] == "message":
                        self._heard(str(message["data"]).split())
            except CONNECTION_LOST as exc:
                log.debug("gate wake-up channel lost: %s", exc)
            finally:
                self.subscribed.clear()
                if pubsub is not None:
                    with contextlib.suppress(*CONNECTION_LOST):
                        await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8
            with contextlib.suppress(TimeoutError):  # reconnect backoff; waiters poll
                async with asyncio.timeout(wait_s):
                    await closing.wait()
            wait_s = min(2 * wait_s, backoff_s)

    def _heard(self, owners: list[str]) -> None:
        if "*" in owners:
            self.wake(owners)
            return
        if waiting := [owner for owner in owners if owner in self._events]:
            self._collect(waiting)
        if len(waiting) < len(owners):
            self._gone([owner for owner in owners if owner not in self._events])

    async def _subscribe(self, pubsub: PubSub) -> None:
        """Subscribed once the server has confirmed every channel: a message published
        earlier is lost."""
        await pubsub.subscribe(*self._channels)
        unconfirmed = len(self._channels)
        async with asyncio.timeout(self._answer_s):  # TimeoutError: an OSError
            while unconfirmed:
                message = await pubsub.get_message(timeout=self._answer_s)
                if message is not None and message["type"] == "subscribe":
                    unconfirmed -= 1
