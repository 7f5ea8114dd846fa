"""The Redis gate's lease metrics move with what happens to the leases, as `/metrics` shows
them (a real redis-server: grants, renewals, expiries, stale releases refused, renewals
that could not reach the server, and the scripts' round trips)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from router.config import GateConfig, RedisGateConfig
from router.gate import make_gate
from router.gate.redis import RedisGate, RedisLease
from router.telemetry.metrics import Metrics
from tests.gate.conftest import nodes
from tests.gate.redis_server import RedisServer

pytestmark = pytest.mark.e2e  # every test here runs a redis-server

Sample = Callable[..., float]


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def sample(metrics: Metrics) -> Sample:
    """`sample(name, **labels)`: the value `/metrics` would show now (0 if absent)."""

    def value(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    return value


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.close()


@pytest.fixture
async def gate(
    own_server: RedisServer, key_prefix: str, metrics: Metrics
) -> AsyncIterator[RedisGate]:
    """A gate whose own renewer stays out of the way: the test renews by hand."""
    config = GateConfig(
        backend="redis",
        redis=RedisGateConfig(
            url=own_server.url,
            key_prefix=key_prefix,
            lease_ttl_s=60,
            renew_every_s=30,
            socket_timeout_s=0.5,
        ),
        max_queue=8,
    )
    built = make_gate(config, nodes(1), metrics.gate)
    assert isinstance(built, RedisGate)
    yield built
    await built.close()


async def test_grants_renewals_and_round_trips_are_counted(gate: RedisGate, sample: Sample) -> None:
    grants = sample("pd_gateway_gate_lease_grants_total", backend="redis")
    renewals = sample("pd_gateway_gate_lease_renewals_total")
    acquires = sample("pd_gateway_gate_redis_round_trip_seconds_count", script="acquire")
    renews = sample("pd_gateway_gate_redis_round_trip_seconds_count", script="renew")

    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    assert await lease.renew()
    assert await lease.renew()
    await lease.release()

    assert sample("pd_gateway_gate_lease_grants_total", backend="redis") == grants + 1
    assert sample("pd_gateway_gate_lease_renewals_total") == renewals + 2
    assert sample("pd_gateway_gate_redis_round_trip_seconds_count", script="acquire") > acquires
    assert sample("pd_gateway_gate_redis_round_trip_seconds_count", script="renew") == renews + 2
    assert sample("pd_gateway_gate_redis_round_trip_seconds_sum", script="renew") > 0


async def test_an_expired_lease_and_its_stale_release_are_counted(
    gate: RedisGate, own_server: RedisServer, key_prefix: str, sample: Sample
) -> None:
    expiries = sample("pd_gateway_gate_lease_expiries_total")
    rejections = sample("pd_gateway_gate_lease_fencing_rejections_total")
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    assert isinstance(lease, RedisLease)
    async with Redis.from_url(own_server.url) as client:  # as if its TTL had run out
        assert await client.delete(f"{key_prefix}:lease:{lease.node.id}") == 1

    assert not await lease.renew()
    assert sample("pd_gateway_gate_lease_expiries_total") == expiries + 1
    await lease.release()
    assert sample("pd_gateway_gate_lease_fencing_rejections_total") == rejections + 1


async def test_a_lease_released_while_the_renewer_renews_it_is_not_counted_as_lost(
    gate: RedisGate, sample: Sample
) -> None:
    """The renewer takes its batch of leases, then a request releases one of them before the
    renewal reaches the server: the server no longer knows the lease, by our own hand."""
    expiries = sample("pd_gateway_gate_lease_expiries_total")
    rejections = sample("pd_gateway_gate_lease_fencing_rejections_total")
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    assert isinstance(lease, RedisLease)
    batch = [lease]
    await lease.release()

    await gate._upkeep.renew(batch)  # the renewer's own call, its batch taken before the release
    assert sample("pd_gateway_gate_lease_expiries_total") == expiries
    assert sample("pd_gateway_gate_lease_fencing_rejections_total") == rejections


async def test_a_renewal_that_cannot_reach_redis_is_counted(
    gate: RedisGate, own_server: RedisServer, sample: Sample
) -> None:
    failures = sample("pd_gateway_gate_lease_renewal_failures_total")
    renewals = sample("pd_gateway_gate_lease_renewals_total")
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    own_server.stop()

    assert await lease.renew()  # still valid for the rest of its TTL, as far as it knows
    assert sample("pd_gateway_gate_lease_renewal_failures_total") == failures + 1
    assert sample("pd_gateway_gate_lease_renewals_total") == renewals
    await lease.release()  # unreachable: it frees itself when its lease expires


async def test_the_health_gauge_follows_redis_with_no_lease_held(
    gate: RedisGate, own_server: RedisServer, sample: Sample
) -> None:
    """A plain outage with nothing held (nothing to renew): the pool snapshot each scrape
    reads is a call to Redis too, and says so."""
    up = {"deployment": "single"}
    assert sample("pd_gateway_gate_redis_up", **up) == 0, "no call yet: no series"
    await gate.snapshot()
    assert sample("pd_gateway_gate_redis_up", **up) == 1

    own_server.stop()
    snapshot = await gate.snapshot()
    assert set(snapshot.out.values()) == {"gate_unavailable"}
    assert sample("pd_gateway_gate_redis_up", **up) == 0

    own_server.start()
    await gate.snapshot()
    assert sample("pd_gateway_gate_redis_up", **up) == 1


async def test_an_error_reply_is_an_answer(gate: RedisGate, sample: Sample) -> None:
    await gate.snapshot()
    with pytest.raises(ResponseError):
        await gate.scripts._redis.run(lambda client: client.execute_command("NO-SUCH-COMMAND"))
    assert sample("pd_gateway_gate_redis_up", deployment="single") == 1
