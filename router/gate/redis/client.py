"""The Redis client for the deployment `gate.redis.url` names: one server, a Redis Cluster
or a master found through Sentinel. Whichever it is, the gate sees one client with the same
commands, scripts and pub/sub.

No client retries a command on its own: a script that may have run is never sent twice
blindly (a Cluster's redirections, which say the command did not run, are still followed).
Instead a pooled connection is checked before each use: one the server has closed (it
restarted, or failed over) is opened again before anything is sent on it. redis-py skips
that check when it handles the server's maintenance notifications, which its newer
releases do by default; the gate turns them off (it never asks for them).

On one server or through Sentinel, a command's time limit is the gate's own, around the
whole call (`GateRedis.run`), not redis-py's socket timeout: on Python 3.11 redis-py applies
that one to each write with `asyncio.wait_for`, a task of its own, so every command waited
a turn of the event loop more (a turn of a loop busy relaying streams is about half a
millisecond). A Cluster client keeps its socket timeout: it handles that error itself.

On a Cluster, wake-ups use classic PUBLISH, which every node forwards to the whole cluster,
so one subscription on any node hears them (Redis 6.2 has no sharded pub/sub to prefer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisClusterException, RedisError, ResponseError

from router.config import RedisAddress, RedisGateConfig

RedisClient = Redis | RedisCluster
T = TypeVar("T")
UNAVAILABLE = (RedisError, RedisClusterException, OSError)
"""What a call to Redis raises when Redis cannot be reached or cannot answer (the call may
then have run or not); a Cluster client raises RedisClusterException when no node of the
cluster answers, which is not a RedisError."""
_TRANSPORT_ERRORS = (AttributeError, TypeError)
CONNECTION_LOST = (*UNAVAILABLE, *_TRANSPORT_ERRORS)
"""What a redis-py call may raise when its connection was closed under it: besides
UNAVAILABLE, AttributeError or TypeError from the transport (`run` turns those into a
ConnectionError; the wake-up listener, which reads its connection itself, catches them)."""
_SENDING = frozenset({"send_packed_command", "_send_packed_command"})
"""redis-py's connection methods that write a command (after connecting and checking the
connection's health): a command whose write failed in them left nothing for Redis to run."""
_CHECKS_TRANSPORT = frozenset({"_send_packed_command"})
"""redis-py 8's method that finds the transport closed, before writing or under the write."""


class _ConnectionLost(ConnectionError):
    """One of _TRANSPORT_ERRORS, as the ConnectionError it means."""

    def __init__(self, transport_error: AttributeError | TypeError) -> None:
        super().__init__(f"connection lost: {transport_error!r}")
        self.transport_error = transport_error


def _unsent(exc: ConnectionError) -> bool:
    """Whether a call failed on a connection found closed while redis-py was writing its
    command: the closed transport took no byte of it, so Redis has nothing to run. Before
    redis-py 8 that is one of _TRANSPORT_ERRORS raised anywhere in its writing methods;
    redis-py 8 checks the transport itself and raises a ConnectionError of its own from its
    write, with no cause or a transport error as its cause. Raised anywhere else (reading
    the answer, a socket error during the write), the command may have run."""
    if isinstance(exc, _ConnectionLost):
        return any(_is_sending(frame) for frame in _frames(exc.transport_error))
    frames = _frames(exc)
    return (
        bool(frames)
        and _is_sending(frames[-1], _CHECKS_TRANSPORT)
        and (exc.__cause__ is None or isinstance(exc.__cause__, _TRANSPORT_ERRORS))
    )


def _frames(exc: BaseException) -> list[Any]:
    """The frames `exc` passed through, outermost first."""
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _is_sending(frame: Any, names: frozenset[str] = _SENDING) -> bool:
    return frame.f_code.co_name in names and frame.f_globals.get("__name__", "").startswith(
        "redis."
    )


class GateRedis:
    """The client and what must be closed with it. Commands go through `run`, which is where
    the client's failures become one of UNAVAILABLE."""

    def __init__(
        self,
        client: RedisClient,
        sentinel: Sentinel | None = None,
        reached: Callable[[bool], None] = lambda _: None,
        timeout_s: float | None = None,
    ) -> None:
        """`reached`: told after each command whether Redis answered (an error reply is an
        answer), for the health gauge; `timeout_s`: each command's time limit, if the
        client has none of its own (a TimeoutError then, one of UNAVAILABLE)."""
        self._client = client
        self._sentinel = sentinel
        self._reached = reached
        self._timeout_s = timeout_s
        self._ready = not isinstance(client, RedisCluster)
        self._learning = asyncio.Lock()

    async def run(self, command: Callable[[RedisClient], Awaitable[T]]) -> T:
        """`command` (one command: a script's call that loads the script first counts as
        one) on the client; one of UNAVAILABLE if Redis cannot be reached.

        redis-py before 8 writing on a connection closed under it raises AttributeError or
        TypeError from the transport (not a ConnectionError); that is a lost connection too.
        After a failure, a Cluster client learns the slot map again before the next command, once
        for all callers: redis-py's Cluster client, closed after an error and then sent
        commands by many callers at once (or sent its very first commands that way), breaks
        connections under them. A command whose connection was found closed while it was
        being written did not run: it is sent once more, after settling again. No other
        failure is retried: the command may have run, and the scripts are not all
        idempotent.
        """
        try:
            return await self._run_once(command)
        except ConnectionError as exc:
            if not _unsent(exc):
                raise
        return await self._run_once(command)

    async def _run_once(self, command: Callable[[RedisClient], Awaitable[T]]) -> T:
        try:
            client = await self.settled()
            async with asyncio.timeout(self._timeout_s):
                result = await command(client)
        except ResponseError:
            self._reached(True)
            self._ready = not isinstance(self._client, RedisCluster)
            raise
        except _TRANSPORT_ERRORS as exc:
            self._reached(False)
            self._ready = not isinstance(self._client, RedisCluster)
            raise _ConnectionLost(exc) from exc
        except UNAVAILABLE:
            self._reached(False)
            self._ready = not isinstance(self._client, RedisCluster)
            raise
        self._reached(True)
        return result

    @property
    def client(self) -> RedisClient:
        """The client, for what needs no command sent (registering a script)."""
        return self._client

    async def pubsub(self) -> PubSub:
        """A pub/sub connection (on a Cluster, to the node serving the channel's slot)."""
        return (await self.settled()).pubsub()

    async def aclose(self) -> None:
        await self._client.aclose()
        if self._sentinel is not None:
            for sentinel in self._sentinel.sentinels:
                await sentinel.aclose()

    async def settled(self) -> RedisClient:
        """The client, ready for commands from many callers at once (see `run`), for a
        caller that handles its failures itself."""
        if not self._ready:
            async with self._learning:
                if not self._ready and isinstance(self._client, RedisCluster):
                    await self._client.initialize()
                    self._ready = True
        return self._client


def _checked_connections() -> dict[str, Any]:
    """The client settings under which a pooled connection the server closed is opened again
    before it is used (see the module's docstring); redis-py before 7 always checks."""
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:
        return {}
    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


def connect(
    config: RedisGateConfig,
    password: str | None,
    *,
    max_connections: int,
    reached: Callable[[bool], None] = lambda _: None,
) -> GateRedis:
    """`password`: from `password_file` or `password` (None to use the URL's, if any);
    `reached`: see `GateRedis`."""
    address = config.address
    timeout_s = config.socket_timeout_s
    if address.deployment == "cluster":
        return GateRedis(
            RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in address.hosts],
                username=address.username,
                password=password or address.password,
                ssl=address.tls,
                max_connections=max_connections,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),
                decode_responses=True,
                **_checked_connections(),
            ),
            reached=reached,
        )
    if address.deployment == "sentinel":
        return _sentinel_master(address, password or address.password, timeout_s, reached)
    # A bounded pool that makes a call wait for a connection (within the call's time limit)
    # rather than fail: redis-py's default pool refuses past its limit.
    pool = BlockingConnectionPool.from_url(
        config.url,
        max_connections=max_connections,
        timeout=timeout_s,
        password=password,
        socket_timeout=None,  # the call's own limit instead (see the module's docstring)
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
        **_checked_connections(),
    )
    return GateRedis(Redis.from_pool(pool), reached=reached, timeout_s=timeout_s)


def _sentinel_master(
    address: RedisAddress,
    password: str | None,
    timeout_s: float,
    reached: Callable[[bool], None],
) -> GateRedis:
    """The master the sentinels name, asked again whenever a connection to it is made, so
    that a failover moves the gate to the new master."""
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]  # typed from redis 8
        list(address.hosts),
        sentinel_kwargs={
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            "ssl": address.tls,
        },
    )
    assert address.master is not None  # configuration requires it with redis+sentinel://
    master = sentinel.master_for(
        address.master,
        db=address.db,
        username=address.username,
        password=password,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
        socket_timeout=None,  # the call's own limit instead (see the module's docstring)
        socket_connect_timeout=timeout_s,
        ssl=address.tls,
        **_checked_connections(),
    )
    return GateRedis(master, sentinel, reached, timeout_s)
