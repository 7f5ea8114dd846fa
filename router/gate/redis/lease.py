"""A node held through a Redis lease: owner and fencing token, kept alive by the gate's
renewer while held, given back by compare-and-delete."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.gate.circuit_breaker import NodeFailure
from router.node import Node


@dataclass(frozen=True, slots=True)
class Grant:
    node: Node
    owner: str  # <replica>|<n>: the replica and the acquire that holds the node
    holder: str
    token: int  # fencing: grows with every grant of the node


class RedisLease:
    """`renew` asks the server; `release` runs at most once. Both go through the gate."""

    __slots__ = (
        "_lost",
        "_on_landed",
        "_release",
        "_released",
        "_renew",
        "_valid_until",
        "grant",
        "landed",
    )

    def __init__(
        self,
        grant: Grant,
        *,
        valid_until: float,
        renew: Callable[[list[RedisLease]], Awaitable[None]],
        release: Callable[[RedisLease, NodeFailure | None, bool], Awaitable[None]],
        on_landed: Callable[[], None] | None = None,
    ) -> None:
        self.grant = grant
        self._valid_until = valid_until  # monotonic: the lease certainly lives until then
        self._renew = renew
        self._release = release
        self._released = False
        self._lost = False
        self.landed = False  # told to the pool's state with the next renewal
        self._on_landed = on_landed  # asks for that renewal soon

    @property
    def node(self) -> Node:
        return self.grant.node

    @property
    def holder(self) -> str:
        return self.grant.holder

    @property
    def released(self) -> bool:
        return self._released

    def renewed(self, *, sent_at: float, ttl_s: float, held: bool) -> None:
        """The server answered a renewal sent at `sent_at` (monotonic)."""
        if held:
            self._valid_until = max(self._valid_until, sent_at + ttl_s)
        else:
            self._lost = True

    def valid(self) -> bool:
        """Without an answer from the server: held for sure only until the TTL runs out."""
        return not self._lost and time.monotonic() < self._valid_until

    async def release(
        self, failure: NodeFailure | None = None, *, reports_health: bool = True
    ) -> None:
        if not self._released:
            self._released = True
            await self._release(self, failure, reports_health)

    def transfer_landed(self) -> None:
        self.landed = True
        if self._on_landed is not None:
            self._on_landed()

    async def renew(self) -> bool:
        if self._released or self._lost:
            return False
        await self._renew([self])
        return self.valid()
