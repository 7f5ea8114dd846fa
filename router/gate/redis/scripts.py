"""Calls to the gate's Lua scripts: arguments by name, the keys each call touches declared,
and the one retry loop a call may need.

The scripts live in `lua/` (package data): `common.lua` is prepended to each, and each
script's header names its own arguments (`-- ARGV: owner holder ...`, `-` for none),
which a call must give exactly. A call declares the keys of the pool and of every node it
touches: the pool's nodes, plus `touching` (a released node, renewed leases, nodes leaving
the pool).

A script that meets the deployment's state in a format this release does not read
(state_format.py) answers `FORMAT <version>` before touching anything: the call raises
`StateUnreadable`, logged and counted, and is not run again.

A script fails before writing anything in two more cases, and the call runs it again:

* `EPOCH <epoch>`: the caller did not know the pool's current state epoch. Either this is
  its first call, or Redis lost the pool's state (restarted without persistence, a
  failover that lost writes); in the second case the script has taken every unleased node
  out (`state_lost`) so that none still serving a forgotten lease is granted again, and
  `on_state_lost` runs.
* `UNDECLARED <node id>`: the call follows a grant of a node another replica knows and this
  call did not declare; it runs again with that node's keys.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from functools import partial
from importlib import resources
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from router.gate.circuit_breaker import EXPECTED_BACK
from router.gate.events import GateEvents
from router.gate.fair_share import MAX_TENANTS
from router.gate.hold_times import HoldTimeEstimator
from router.gate.redis.client import GateRedis
from router.gate.redis.keys import KeyLayout, PoolKeys
from router.gate.redis.state_format import StateUnreadable, lua_constants

log = logging.getLogger("pd_gateway.gate")

NAMES = ("acquire", "claim", "collect", "abandon", "release", "renew", "admin", "state", "close")
_EPOCH_RETRIES = 3
_ARGV = re.compile(r"^-- ARGV:(.*)$", re.MULTILINE)
ArgValue = str | int | float


def load_sources() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each script's full source (common part first) and the names of its own arguments."""
    folder = resources.files(__package__).joinpath("lua")
    common = _constants() + folder.joinpath("common.lua").read_text(encoding="utf-8")
    sources = {}
    for name in NAMES:
        body = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
        header = _ARGV.search(body)
        if header is None:
            raise RuntimeError(f"lua/{name}.lua does not name its arguments (-- ARGV: ...)")
        names = tuple(n for n in header.group(1).split() if n != "-")
        if not all(n.isidentifier() for n in names):
            raise RuntimeError(f"lua/{name}.lua: arguments are names, or `-` for none")
        sources[name] = (common + body, names)
    return sources


def _constants() -> str:
    """Lua definitions of what the scripts share with the Python side of the gate."""
    reasons = ", ".join(f'["{r}"] = true' for r in sorted(EXPECTED_BACK))
    return (
        f"local EXPECTED_BACK = {{{reasons}}}\n"
        f"local HOLD_INITIAL_S = {HoldTimeEstimator.INITIAL_S!r}\n"
        f"local HOLD_MIN_SAMPLES = {HoldTimeEstimator.MIN_SAMPLES}\n"
        f"local MAX_TENANTS = {MAX_TENANTS}\n"
        f"{lua_constants()}"
    )


def __getattr__(name: str) -> Any:
    """`SCRIPTS`: each script's full source by name, read when asked for (`pd-gateway check
    --probe` loads them all into the server)."""
    if name == "SCRIPTS":
        return {script: source for script, (source, _) in load_sources().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Scripts:
    """One pool's script calls, for one replica. At most `max_calls` run at once (the rest
    wait their turn), so that many waiters polling at once never exhaust the connections."""

    def __init__(
        self,
        redis: GateRedis,
        *,
        layout: KeyLayout,
        pool: PoolKeys,
        replica: str,
        lease_ttl_s: float,
        claim_window_s: float,
        failure_threshold: int,
        node_ids: Sequence[str],
        metrics: GateEvents,
        on_state_lost: Callable[[], None],
        max_calls: int,
    ) -> None:
        self._layout = layout
        self._pool_keys = pool.declared()
        self._metrics = metrics
        self._on_state_lost = on_state_lost
        self._calls = asyncio.Semaphore(max_calls)
        self._scripts: dict[str, tuple[AsyncScript, tuple[str, ...]]] = {
            name: (redis.client.register_script(source), names)
            for name, (source, names) in load_sources().items()
        }
        self._redis = redis
        self._channel = layout.channel
        self._ttl_ms = math.ceil(lease_ttl_s * 1000)
        self._claim_ms = math.ceil(claim_window_s * 1000)
        self._threshold = failure_threshold
        self._replica = replica
        self._epoch = ""  # learnt from the first call's EPOCH answer
        self._in_flight: set[asyncio.Future[Any]] = set()
        self.node_ids = list(node_ids)  # the pool, in grant order

    async def run(self, script: str, *, touching: Iterable[str] = (), **args: ArgValue) -> Any:
        """Run `script` with its named arguments; one of client.UNAVAILABLE if Redis cannot
        be reached (the script may then have run or not).

        A caller cancelled meanwhile is cancelled at once, but the call itself runs to its
        end: a command cut off half-way would leave its connection unusable (redis-py's
        Cluster client even hands it to the next caller). The scripts expect this: a waiter
        gives up with a mark (`abandon`) that voids its acquire or claim, whenever it runs.
        """
        return await self._begin(script, touching, args, None)

    def start(
        self,
        script: str,
        *,
        touching: Iterable[str] = (),
        on_reply: Callable[[Any], None] | None = None,
        **args: ArgValue,
    ) -> asyncio.Future[Any]:
        """`run`'s call, started now: its answer, whoever waits for it. `on_reply` sees the
        reply in the call's own turn of the loop, before anyone waiting for the answer (a
        callback added to the answer would run a turn later)."""
        return self._begin(script, touching, args, on_reply)

    def _begin(
        self,
        script: str,
        touching: Iterable[str],
        args: dict[str, ArgValue],
        on_reply: Callable[[Any], None] | None,
    ) -> asyncio.Future[Any]:
        """The call runs in a task of its own, which sets the answer as it ends: a waiter
        cancelled cancels only the answer, and is woken a turn after the reply, where
        awaiting a shielded task would take two."""
        _, names = self._scripts[script]
        if set(args) != set(names):
            raise TypeError(f"script {script} takes {names}, not {tuple(args)}")
        named = [item for name in names for item in (name, args[name])]
        answer = asyncio.get_running_loop().create_future()
        answer.add_done_callback(_seen)
        call = asyncio.ensure_future(
            _answering(answer, self._call(script, list(touching), named), on_reply)
        )
        self._in_flight.add(call)
        call.add_done_callback(self._ended)
        return answer

    async def settle(self, timeout_s: float) -> None:
        """Wait (at most `timeout_s`) for the calls under way, their callers gone or not."""
        if self._in_flight:
            await asyncio.wait(list(self._in_flight), timeout=timeout_s)

    def _ended(self, call: asyncio.Future[Any]) -> None:
        self._in_flight.discard(call)
        if not call.cancelled():
            call.exception()  # a caller that left does not see it, nor does asyncio's log

    async def _call(self, script: str, others: list[str], named: list[ArgValue]) -> Any:
        call = self._scripts[script][0]
        epoch_retries = _EPOCH_RETRIES
        while True:
            sent_at = time.perf_counter()
            epoch = self._epoch
            try:
                keys = self._keys(others)
                args = [
                    self._channel,
                    self._ttl_ms,
                    self._threshold,
                    self._replica,
                    epoch,
                    "\n".join(self.node_ids),
                    "\n".join(others),
                    self._claim_ms,
                    *named,
                ]
                async with self._calls:
                    return await self._redis.run(partial(call, keys, args))
            except ResponseError as exc:
                kind, _, value = str(exc).partition(" ")
                if kind == "FORMAT":
                    raise self._unreadable(value) from None
                if kind == "UNDECLARED" and value not in others:
                    others.append(value)  # the script did nothing: run it again
                    continue
                if kind != "EPOCH" or epoch_retries == 0:
                    raise
                epoch_retries -= 1
                if epoch and value != self._epoch:  # not just news of another call's answer
                    self._on_state_lost()
                self._epoch = value  # the script did nothing else: run it again
            finally:
                self._metrics.round_trip(script, time.perf_counter() - sent_at)

    def _unreadable(self, version: str) -> StateUnreadable:
        self._metrics.unreadable_record("state_version")
        unreadable = StateUnreadable(version)
        log.error("%s: refused", unreadable)
        return unreadable

    def _keys(self, others: list[str]) -> list[str]:
        keys = list(self._pool_keys)
        for node_id in [*self.node_ids, *others]:
            keys += self._layout.node(node_id)
        return keys


async def _answering(
    answer: asyncio.Future[Any],
    call: Coroutine[Any, Any, Any],
    on_reply: Callable[[Any], None] | None,
) -> None:
    try:
        reply = await call
    except asyncio.CancelledError:
        answer.cancel()
        raise
    except BaseException as exc:
        if not answer.done():
            answer.set_exception(exc)
        return
    try:
        if on_reply is not None:
            on_reply(reply)
    finally:
        if not answer.done():
            answer.set_result(reply)


def _seen(answer: asyncio.Future[Any]) -> None:
    if not answer.cancelled():
        answer.exception()  # a caller that left does not see it, nor does asyncio's log
