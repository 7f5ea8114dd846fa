"""Which waiter a freed node goes to: the gate's one ordering policy, kept here for the
memory backend and mirrored by the Redis backend's scripts (`redis/lua/common.lua`, `choose`).

1. **Priority**: the highest priority with a waiter that may hold one more node goes first.
2. **Tenants, by weighted fair share of node time**: within a priority, the tenant with the
   least *virtual node time* goes first. A tenant's virtual time is the node time its
   requests have held (seconds, divided by its weight) plus, for each node it holds now, the
   time held so far or the pool's median hold, whichever is longer (so that a tenant handed
   four nodes in one instant is charged for them at once). This is start-time fair queueing
   as Linux's CFS schedules tasks by `vruntime`: a tenant that asks while holding no node is
   first lifted to the pool's virtual clock (the virtual time the last node was handed out
   at), so time it spent idle earns no credit to hog the pool later, and a tenant alone
   spends no debt.
3. **Within a tenant**: earliest deadline first (a waiter without one is due on arrival),
   then arrival.

A tenant holding its `max_nodes` is passed over, whatever its place, until it gives a node
back. Nothing else is capped: a node free with only capped waiters stays free for the next
request that may hold it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from router.gate.base import Share

MAX_TENANTS = 4096
"""Tenants whose virtual time is kept beyond the clock; past it, those nearest the clock
(whose debt is smallest) are forgotten. A tenant with no entry is at the clock."""


@dataclass(order=True, slots=True)
class Waiter:
    """A waiter's place: `due` (monotonic) is its deadline, for one that must have its node
    by then (an objective), else when it arrived; `arrival` keeps equal ones first come,
    first served."""

    key: tuple[float, int]  # (due, arrival): its order within its tenant
    priority: float = field(compare=False)
    share: Share = field(compare=False)
    holder: str = field(compare=False)
    active: bool = field(default=True, compare=False)


W = TypeVar("W", bound=Waiter)


class VirtualTime:
    """Each tenant's weighted node time, and the pool's virtual clock (seconds)."""

    __slots__ = ("_used", "clock")

    def __init__(self) -> None:
        self.clock = 0.0
        self._used: dict[str, float] = {}

    def of(self, tenant: str) -> float:
        return self._used.get(tenant, self.clock)

    def lift(self, tenant: str) -> None:
        """The tenant starts to wait, holding nothing: no credit from its idle time."""
        if self._used.get(tenant, self.clock) <= self.clock:
            self._used.pop(tenant, None)

    def served_at(self, virtual: float) -> None:
        """A tenant was granted a node at `virtual`: the clock moves on to it."""
        self.clock = max(self.clock, virtual)

    def charge(self, share: Share, held_s: float) -> None:
        """A node held `held_s` by `share`'s tenant has been given back."""
        self._used[share.tenant] = self.of(share.tenant) + held_s / share.weight
        if len(self._used) > MAX_TENANTS:
            self._forget()

    def _forget(self) -> None:
        ahead = {t: v for t, v in self._used.items() if v > self.clock}
        if len(ahead) > MAX_TENANTS // 2:
            ahead = dict(heapq.nlargest(MAX_TENANTS // 2, ahead.items(), key=lambda kv: kv[1]))
        self._used = ahead

    def __len__(self) -> int:
        return len(self._used)


@dataclass(frozen=True, slots=True)
class Hold:
    """A node held (or handed over and not yet taken): by whom, since when (monotonic)."""

    share: Share
    since: float


def holding(holds: Iterable[Hold], *, now: float, typical_s: float) -> dict[str, tuple[int, float]]:
    """Per tenant: how many nodes it holds, and their weighted time so far (each at least
    `typical_s`, the pool's median hold)."""
    out: dict[str, tuple[int, float]] = {}
    for hold in holds:
        count, time_s = out.get(hold.share.tenant, (0, 0.0))
        held_s = max(now - hold.since, typical_s)
        out[hold.share.tenant] = (count + 1, time_s + held_s / hold.share.weight)
    return out


class FairQueue(Generic[W]):
    """The waiters, by priority band and tenant; each tenant's own by (due, arrival).

    A waiter that gives up is marked inactive and skipped when met (`discard`); the heaps
    are rebuilt before such entries pile up."""

    def __init__(self) -> None:
        self._bands: dict[float, dict[str, list[W]]] = {}
        self._size = 0  # entries, active or not
        self.active = 0

    def __len__(self) -> int:
        return self.active

    def push(self, waiter: W) -> None:
        band = self._bands.setdefault(waiter.priority, {})
        heapq.heappush(band.setdefault(waiter.share.tenant, []), waiter)
        self._size += 1
        self.active += 1
        waiter.active = True

    def discard(self, waiter: W) -> None:
        if waiter.active:
            waiter.active = False
            self.active -= 1
            if self._size > 64 and self._size > 2 * self.active:
                self._compact()

    def pick(self, may_hold: Callable[[Share], bool], virtual: Callable[[str], float]) -> W | None:
        """The next waiter to serve (taken off the queue), or None if none may hold a node:
        `may_hold` says whether a tenant is below its cap, `virtual` gives its virtual time."""
        for priority in sorted(self._bands, reverse=True):
            band = self._bands[priority]
            best: tuple[float, tuple[float, int]] | None = None
            best_heap: list[W] | None = None
            for tenant in list(band):
                heap = band[tenant]
                while heap and not heap[0].active:
                    heapq.heappop(heap)
                    self._size -= 1
                if not heap:
                    del band[tenant]
                    continue
                if not may_hold(heap[0].share):
                    continue
                rank = (virtual(tenant), heap[0].key)
                if best is None or rank < best:
                    best, best_heap = rank, heap
            if not band:
                del self._bands[priority]
            if best_heap is not None:
                waiter = heapq.heappop(best_heap)
                self._size -= 1
                self.active -= 1
                waiter.active = False
                return waiter
        return None

    def drain(self) -> list[W]:
        """Every active waiter, taken off the queue."""
        bands, self._bands = self._bands, {}
        self._size = self.active = 0
        drained = [w for band in bands.values() for heap in band.values() for w in heap if w.active]
        for waiter in drained:
            waiter.active = False
        return drained

    def _compact(self) -> None:
        for priority, band in list(self._bands.items()):
            for tenant, heap in list(band.items()):
                kept = [w for w in heap if w.active]
                if kept:
                    heapq.heapify(kept)
                    band[tenant] = kept
                else:
                    del band[tenant]
            if not band:
                del self._bands[priority]
        self._size = self.active
