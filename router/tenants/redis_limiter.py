"""`RedisLimiter`: the tenants' counts of every replica on the gate's Redis (GCRA as
router/tenants/limiter.py has it, one script per call on Redis's own clock). Imported only
where the gate's backend is Redis, so that a gateway on the memory backend never loads the
Redis client."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial
from importlib import resources
from typing import Any
from urllib.parse import quote_from_bytes

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from router.gate.redis.client import UNAVAILABLE, GateRedis
from router.tenants.limiter import (
    SLACK_S,
    LimiterUnavailable,
    LimiterUnreadable,
    Rate,
    Take,
    Verdict,
    checked_cost,
    verdict_after,
)

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
            checked_cost(take.cost)
        reply = await self._run("take", takes)
        return [
            verdict_after(
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
