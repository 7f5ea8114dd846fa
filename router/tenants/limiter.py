"""The tenants' rate limits and quotas, counted by GCRA, the generic cell rate algorithm (as
in `redis-cell` and `throttled`).

GCRA keeps one timestamp per bucket, its theoretical arrival time (TAT): when the bucket
would be full again had nothing more been taken. Taking `cost` units moves it on by
`cost` emission intervals (a minute / the rate); the units fit if the TAT then runs no
more than the burst tolerance (a minute) ahead of now. That is a token bucket refilling
continuously, with no refill to schedule and nothing to sweep: a tenant idle for a minute
has a full bucket and needs no state. On Redis the one timestamp is read and moved by one
script on Redis's own clock, so every replica counts against the same allowance exactly,
whatever their own clocks say.

`remaining` counts down from the rate, as OpenAI's `x-ratelimit-remaining-*` headers do:
a minute's worth may be spent at once, then it comes back at the rate.

On Redis a bucket's value carries its version, by the rule the gate's state follows
(router/gate/redis/state_format.py: a release that introduces version N+1 reads it but
still writes N; only the release after it writes N+1). Version 1 is the TAT alone, a
number; a later version starts with its number and a colon. In the value, not in a key of
the deployment's as the gate's state has it: a call's keys are one tenant's, on that
tenant's Cluster slot. A call that meets a bucket of a version this release does not read
takes nothing and raises `LimiterUnreadable`, rather than take the bucket for full.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

WINDOW_S = 60.0
"""A rate's period unless it names its own, and its burst tolerance: a whole period's worth
may be taken at once."""
SLACK_S = 1e-6
"""Rounding the comparisons forgive: a cost that fits exactly must fit, whatever the
doubles' last bits say (Redis's clock counts microseconds; this is one)."""
BUCKET_READS = frozenset({1})
"""The versions of a bucket's value on Redis this release reads; it writes version 1."""


@dataclass(frozen=True, slots=True)
class Rate:
    """`limit` units (requests, tokens, node-milliseconds) per `window_s`."""

    limit: int
    window_s: float = WINDOW_S

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"a rate is at least 1 per window, not {self.limit}")
        if not self.window_s > 0:
            raise ValueError(f"a rate's window is above 0 s, not {self.window_s}")

    def span_s(self, units: int) -> float:
        """How long `units` take to come back (one division: a window's worth is exactly the
        window)."""
        return units * self.window_s / self.limit


@dataclass(frozen=True, slots=True)
class Verdict:
    """One `take`: whether the units were taken, and the bucket as the call left it."""

    allowed: bool
    limit: int  # the rate per window
    remaining: int  # whole units left, 0..limit
    reset_s: float  # until the bucket is full again
    retry_after_s: float  # until the cost would fit (0 when allowed)


@dataclass(frozen=True, slots=True)
class Take:
    """`cost` units from `key`'s bucket. A take that does not `bind` is only looked at: it
    is taken when it fits, and its not fitting refuses none of the others."""

    key: str
    rate: Rate
    cost: int
    binds: bool = True


class LimiterUnavailable(Exception):
    """The counts cannot be reached (the cause is chained): whether the request goes
    through anyway is the caller's setting."""


class LimiterUnreadable(LimiterUnavailable):
    """A bucket on Redis is stored in `version` (`?`: a value of no version), which this
    release does not read: the call took nothing."""

    def __init__(self, version: str) -> None:
        super().__init__(
            f"a tenant's bucket in Redis is stored in format version {version!r};"
            f" this release reads {sorted(BUCKET_READS)} (docs/upgrades.md)"
        )
        self.version = version


class Limiter(Protocol):
    async def take(self, key: str, rate: Rate, cost: int) -> Verdict:
        """Take `cost` units (0 or more) from `key`'s bucket if they fit; a cost above the
        rate never fits (`retry_after_s` is then the time until the bucket is full)."""
        ...

    async def take_all(self, takes: Sequence[Take]) -> list[Verdict]:
        """Each take's units, all at once or none (on Redis one call): taken only if every
        binding take fits. A verdict per take, in order: whether it fits, and its bucket as
        the call left it."""
        ...

    async def settle(self, key: str, rate: Rate, delta: int) -> None:
        """Charge `delta` units more (negative: give some back), unchecked: a charge may
        take the bucket below empty, which later takes then wait out; a refund never fills
        it past full."""
        ...

    async def close(self) -> None: ...


def verdict_after(rate: Rate, allowed: bool, ahead_s: float, retry_after_s: float) -> Verdict:
    """The verdict of a call that left the TAT `ahead_s` ahead of now. A rate changed by a
    reload applies at once: the TAT is a time, whatever rate moved it."""
    ahead_s = max(0.0, ahead_s)
    left = (rate.window_s - ahead_s + SLACK_S) * rate.limit / rate.window_s
    return Verdict(
        allowed=allowed,
        limit=rate.limit,
        remaining=min(rate.limit, max(0, math.floor(left))),
        reset_s=ahead_s,
        retry_after_s=0.0 if allowed else max(0.0, retry_after_s),
    )


def checked_cost(cost: int) -> int:
    if cost < 0:
        raise ValueError(f"a cost is 0 or more, not {cost} (settle gives units back)")
    return cost


class MemoryLimiter:
    """The counts of one process: a TAT per key, for at most `max_keys` keys. Beyond that
    the least recently used is forgotten (its tenant finds a full bucket), so that clients
    inventing names cost bounded memory; a key whose bucket is full again is dropped at
    once. `clock`: seconds, monotonic (tests give their own)."""

    def __init__(self, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys is at least 1, not {max_keys}")
        self._max_keys = max_keys
        self._clock = clock
        self._tats: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        """Keys whose bucket is kept (not full)."""
        return len(self._tats)

    async def take(self, key: str, rate: Rate, cost: int) -> Verdict:
        return (await self.take_all([Take(key, rate, cost)]))[0]

    async def take_all(self, takes: Sequence[Take]) -> list[Verdict]:
        now = self._clock()
        looked = []  # (fits, TAT before, TAT after)
        for take in takes:
            tat = max(self._tats.get(take.key, now), now)
            ahead = tat - now + take.rate.span_s(checked_cost(take.cost))
            looked.append((ahead <= take.rate.window_s + SLACK_S, tat, now + ahead))
        taken = all(fits for (fits, _, _), take in zip(looked, takes, strict=True) if take.binds)
        verdicts = []
        for (fits, tat, after), take in zip(looked, takes, strict=True):
            rate = take.rate
            if taken and fits:
                self._keep(take.key, after, now)
                verdicts.append(verdict_after(rate, True, after - now, 0.0))
                continue
            if take.key in self._tats:
                self._tats.move_to_end(take.key)
            retry = tat - now if take.cost > rate.limit else after - now - rate.window_s
            verdicts.append(verdict_after(rate, fits, tat - now, 0.0 if fits else retry))
        return verdicts

    async def settle(self, key: str, rate: Rate, delta: int) -> None:
        now = self._clock()
        self._keep(key, max(self._tats.get(key, now), now) + rate.span_s(delta), now)

    async def close(self) -> None:
        self._tats.clear()

    def _keep(self, key: str, tat: float, now: float) -> None:
        tats = self._tats
        if tat <= now:
            tats.pop(key, None)
            return
        tats[key] = tat
        tats.move_to_end(key)
        while len(tats) > self._max_keys:
            tats.popitem(last=False)
