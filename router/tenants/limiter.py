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

import asyncio
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import resources
from typing import Any, Protocol
from urllib.parse import quote_from_bytes

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from router.gate.redis.client import UNAVAILABLE, GateRedis

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


def _verdict(rate: Rate, allowed: bool, ahead_s: float, retry_after_s: float) -> Verdict:
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


def _checked(cost: int) -> int:
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
            ahead = tat - now + take.rate.span_s(_checked(take.cost))
            looked.append((ahead <= take.rate.window_s + SLACK_S, tat, now + ahead))
        taken = all(fits for (fits, _, _), take in zip(looked, takes, strict=True) if take.binds)
        verdicts = []
        for (fits, tat, after), take in zip(looked, takes, strict=True):
            rate = take.rate
            if taken and fits:
                self._keep(take.key, after, now)
                verdicts.append(_verdict(rate, True, after - now, 0.0))
                continue
            if take.key in self._tats:
                self._tats.move_to_end(take.key)
            retry = tat - now if take.cost > rate.limit else after - now - rate.window_s
            verdicts.append(_verdict(rate, fits, tat - now, 0.0 if fits else retry))
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


_SCRIPTS = ("take", "settle")


def _sources() -> dict[str, str]:
    """Each script's full source: the constants shared with this module, `common.lua`, then
    the script's own."""
    folder = resources.files(__package__).joinpath("lua")
    common = f"local SLACK_MS = {SLACK_S * 1000:.17g}\n" + folder.joinpath("common.lua").read_text(
        encoding="utf-8"
    )
    return {
        name: common + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        for name in _SCRIPTS
    }


class RedisLimiter:
    """The counts of every replica, on Redis: a key per bucket, `<key_prefix>:<key>` (the
    key percent-encoded, so that any text keeps to its place in the layout). Each call is
    one script on the keys it declares, one hash tag's, so it runs on a Redis Cluster too
    (the tenants spread over its slots). The TAT is a time on Redis's clock, in ms, and the
    key expires once the bucket is full again: an idle tenant costs Redis nothing.

    Takes over `redis` (closed with the limiter). At most `max_calls` calls run at once, the
    rest waiting their turn: no more than the client's connections, since a Cluster client
    refuses a call past its limit rather than wait for a connection."""

    def __init__(self, redis: GateRedis, key_prefix: str, *, max_calls: int = 8) -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._scripts: dict[str, AsyncScript] = {
            name: redis.client.register_script(source) for name, source in _sources().items()
        }
        self._calls = asyncio.Semaphore(max_calls)
        self._in_flight: set[asyncio.Future[Any]] = set()

    def redis_key(self, key: str) -> str:
        """The Redis key of `key`'s bucket. A `{...}` in `key` is kept, as a hash tag: the
        buckets taken together in one call name one (on a Cluster, one slot holds them)."""
        name = quote_from_bytes(key.encode("utf-8", "surrogatepass"), safe=":@{}")
        return f"{self._prefix}:{name}"

    async def take(self, key: str, rate: Rate, cost: int) -> Verdict:
        return (await self.take_all([Take(key, rate, cost)]))[0]

    async def take_all(self, takes: Sequence[Take]) -> list[Verdict]:
        for take in takes:
            _checked(take.cost)
        reply = await self._run("take", takes)
        return [
            _verdict(
                t.rate,
                reply[3 * i] == 1,
                float(reply[3 * i + 1]) / 1000,
                float(reply[3 * i + 2]) / 1000,
            )
            for i, t in enumerate(takes)
        ]

    async def settle(self, key: str, rate: Rate, delta: int) -> None:
        await self._run("settle", [Take(key, rate, delta)])

    async def close(self) -> None:
        """Once the calls under way have ended (each within its own time limit)."""
        if self._in_flight:
            await asyncio.wait(list(self._in_flight))
        await self._redis.aclose()

    async def _run(self, script: str, takes: Sequence[Take]) -> Any:
        """The script's answer; LimiterUnavailable if Redis cannot answer (the call may
        have counted or not), LimiterUnreadable if a bucket is of a version this release
        does not read (it counted nothing). A caller cancelled while waiting its turn sends
        nothing; one cancelled later leaves at once, but its call runs to its end in a task
        of its own: a command cut off half-way would leave its connection unusable (see
        router.gate.redis.scripts)."""
        arguments: list[str | int] = []
        for take in takes:
            window_ms = f"{take.rate.window_s * 1000:.17g}"
            arguments += [take.rate.limit, take.cost, window_ms, int(take.binds)]
        command = partial(self._scripts[script], [self.redis_key(t.key) for t in takes], arguments)
        await self._calls.acquire()
        call = asyncio.ensure_future(self._redis.run(command))
        self._in_flight.add(call)
        call.add_done_callback(self._ended)
        try:
            return await asyncio.shield(call)
        except ResponseError as exc:
            kind, _, version = str(exc).partition(" ")
            if kind == "FORMAT":
                raise LimiterUnreadable(version) from exc
            raise LimiterUnavailable(f"the rate limits' Redis cannot answer: {exc!r}") from exc
        except UNAVAILABLE as exc:
            raise LimiterUnavailable(f"the rate limits' Redis cannot answer: {exc!r}") from exc

    def _ended(self, call: asyncio.Future[Any]) -> None:
        self._calls.release()
        self._in_flight.discard(call)
        if not call.cancelled():
            call.exception()  # a caller that left does not see it, nor does asyncio's log
