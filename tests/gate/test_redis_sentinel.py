"""The Redis gate behind Sentinel: a real master, its replica and a Sentinel started from
the same redis-server binary. The gate finds the master by asking the Sentinel, and after a
failover it serves from the new master."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio import Redis

from router.config import GateConfig, RedisGateConfig
from router.gate import GateRejected, Lease, make_gate
from router.gate.redis import RedisGate
from tests.gate.conftest import nodes
from tests.gate.redis_deployments import HOST, LocalSentinel, running_sentinel

pytestmark = pytest.mark.e2e  # every test here runs redis-server processes

FAST = {"lease_ttl_s": 1.2, "renew_every_s": 0.3, "poll_s": 0.1, "socket_timeout_s": 0.5}


@pytest.fixture
def sentinel() -> Iterator[LocalSentinel]:
    with running_sentinel() as deployment:
        yield deployment


def gate_on(url: str, prefix: str) -> RedisGate:
    config = GateConfig(
        backend="redis",
        redis=RedisGateConfig(url=url, key_prefix=prefix, **FAST),  # type: ignore[arg-type]
        max_queue=8,
    )
    gate = make_gate(config, nodes(2))
    assert isinstance(gate, RedisGate)
    return gate


async def lease_on(port: int, gate: RedisGate, lease: Lease) -> str | None:
    """The holder the server on `port` records for `lease`'s node."""
    async with Redis(host=HOST, port=port, decode_responses=True) as server:
        holder = await server.hget(gate.keys.node(lease.node.id)[1], "holder")
        return None if holder is None else str(holder)


async def test_the_gate_serves_from_the_master_sentinel_names_and_follows_a_failover(
    sentinel: LocalSentinel, key_prefix: str
) -> None:
    gate = gate_on(sentinel.url, key_prefix)
    try:
        before = await gate.acquire(priority=0, wait_s=1, holder="before")
        assert await lease_on(sentinel.master.port, gate, before) == "before"
        await before.release()

        sentinel.fail_over()  # the replica is the master now; the old master follows it
        after: Lease | None = None
        for _ in range(20):  # connections to the old master fail once, then the new is asked
            try:
                after = await gate.acquire(priority=0, wait_s=1, holder="after")
                break
            except GateRejected as refused:
                assert refused.reason == "gate_unavailable"
        assert after is not None, "no slot granted through the new master"
        assert await lease_on(sentinel.replica.port, gate, after) == "after"
        assert await after.renew()
        await after.release()
        assert await lease_on(sentinel.replica.port, gate, after) is None
    finally:
        await gate.close()


async def test_a_master_sentinel_does_not_know_makes_the_gate_unavailable(
    sentinel: LocalSentinel, key_prefix: str
) -> None:
    gate = gate_on(sentinel.url_for("no-such-master"), key_prefix)
    try:
        with pytest.raises(GateRejected) as refused:
            await asyncio.wait_for(gate.acquire(priority=0, wait_s=1, holder="a"), 10)
        assert refused.value.reason == "gate_unavailable"
    finally:
        await gate.close()
