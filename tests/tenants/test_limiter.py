"""The tenants' rate limiter (GCRA): in memory, on a clock the tests move, the exact
figures; on a real Redis (one server and a Cluster), the same behaviour on Redis's own
clock, with margins, shared by every replica, refused with LimiterUnavailable when Redis
cannot answer, and with LimiterUnreadable when a bucket is of a version it does not read."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest

from router.config import RedisGateConfig
from router.gate.redis.client import RedisClient, connect
from router.tenants.limiter import (
    Limiter,
    LimiterUnavailable,
    LimiterUnreadable,
    MemoryLimiter,
    Rate,
    Take,
    Verdict,
)
from router.tenants.redis_limiter import RedisLimiter
from tests.gate.partition import PartitionableLink
from tests.gate.redis_deployments import LocalCluster, running_cluster
from tests.gate.redis_server import RedisServer, running_redis

PER_SECOND = Rate(60)  # T = 1 s: one unit back each second


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def memory(clock: Clock) -> MemoryLimiter:
    return MemoryLimiter(clock=clock)


# In memory: the exact figures.


async def test_a_minutes_worth_at_once_then_refused_until_it_fits(
    memory: MemoryLimiter, clock: Clock
) -> None:
    for left in range(59, -1, -1):
        verdict = await memory.take("t", PER_SECOND, 1)
        assert verdict.allowed and verdict.remaining == left
    assert verdict == Verdict(True, 60, 0, 60.0, 0.0)

    refused = await memory.take("t", PER_SECOND, 1)
    assert refused == Verdict(False, 60, 0, 60.0, 1.0)
    assert (await memory.take("t", PER_SECOND, 3)).retry_after_s == 3.0
    clock.now += 0.5
    assert (await memory.take("t", PER_SECOND, 1)).retry_after_s == pytest.approx(0.5)
    clock.now += 0.5
    assert await memory.take("t", PER_SECOND, 1) == Verdict(True, 60, 0, 60.0, 0.0)


async def test_the_bucket_refills_at_the_rate(memory: MemoryLimiter, clock: Clock) -> None:
    assert (await memory.take("t", PER_SECOND, 60)).allowed
    clock.now += 10
    looked = await memory.take("t", PER_SECOND, 0)  # a cost of 0 only looks
    assert looked == Verdict(True, 60, 10, 50.0, 0.0)
    assert (await memory.take("t", PER_SECOND, 10)).allowed
    assert not (await memory.take("t", PER_SECOND, 1)).allowed
    clock.now += 60
    assert await memory.take("t", PER_SECOND, 0) == Verdict(True, 60, 60, 0.0, 0.0)
    assert len(memory) == 0  # full again: nothing kept


async def test_remaining_and_reset_with_an_interval_that_is_not_round(
    memory: MemoryLimiter, clock: Clock
) -> None:
    """60/7 s is no exact double: the seventh of seven units still fits, none more."""
    seven = Rate(7)
    for left in range(6, -1, -1):
        verdict = await memory.take("t", seven, 1)
        assert verdict.allowed and verdict.remaining == left
        assert verdict.reset_s == pytest.approx((7 - left) * 60 / 7)
    refused = await memory.take("t", seven, 1)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(60 / 7)

    tokens = Rate(1_000_000)
    verdict = await memory.take("u", tokens, 250_000)
    assert verdict == Verdict(True, 1_000_000, 750_000, 15.0, 0.0)
    clock.now += 3
    assert (await memory.take("u", tokens, 0)).remaining == 800_000


async def test_a_cost_above_the_limit_never_fits(memory: MemoryLimiter, clock: Clock) -> None:
    hundred = Rate(100)
    assert await memory.take("t", hundred, 101) == Verdict(False, 100, 100, 0.0, 0.0)
    assert len(memory) == 0  # refused: nothing stored
    assert (await memory.take("t", hundred, 50)).allowed
    refused = await memory.take("t", hundred, 101)
    assert refused == Verdict(False, 100, 50, 30.0, 30.0)  # until the bucket is full
    assert (await memory.take("t", hundred, 0)).remaining == 50  # unchanged
    assert (await memory.take("t", hundred, 100)).retry_after_s == 30.0  # fits once full


async def test_settle_charges_and_refunds_never_past_full(
    memory: MemoryLimiter, clock: Clock
) -> None:
    assert (await memory.take("t", PER_SECOND, 10)).remaining == 50
    await memory.settle("t", PER_SECOND, 30)
    assert (await memory.take("t", PER_SECOND, 0)).remaining == 20
    await memory.settle("t", PER_SECOND, 100)  # unchecked: 80 below empty
    owing = await memory.take("t", PER_SECOND, 1)
    assert owing == Verdict(False, 60, 0, 140.0, 81.0)
    await memory.settle("t", PER_SECOND, -30)
    assert (await memory.take("t", PER_SECOND, 0)).reset_s == 110.0

    await memory.settle("t", PER_SECOND, -1000)  # a refund never makes the bucket overflow
    assert await memory.take("t", PER_SECOND, 0) == Verdict(True, 60, 60, 0.0, 0.0)
    assert (await memory.take("t", PER_SECOND, 60)).allowed
    assert not (await memory.take("t", PER_SECOND, 1)).allowed

    await memory.settle("new", PER_SECOND, 15)  # a charge on a full bucket
    assert (await memory.take("new", PER_SECOND, 0)).remaining == 45
    clock.now += 100
    await memory.settle("new", PER_SECOND, -5)  # refilled meanwhile: nothing to give back
    assert len(memory) == 1  # "new" dropped, full; "t" still counting down


async def test_takes_together_are_all_taken_or_none(memory: MemoryLimiter) -> None:
    await all_or_none(memory)


async def all_or_none(limiter: Limiter) -> None:
    """A binding take that does not fit leaves the others untouched; one that does not bind
    refuses nothing, and is taken only where it fits."""
    requests, tokens, quota = Rate(10), Rate(100), Rate(5)
    both = [Take("{t}:requests", requests, 1), Take("{t}:tokens", tokens, 150)]
    refused = await limiter.take_all(both)
    assert [v.allowed for v in refused] == [True, False]
    assert (await limiter.take("{t}:requests", requests, 0)).remaining == 10  # not taken
    await limiter.settle("{t}:quota", quota, 10)  # a quota spent past its window
    looked = await limiter.take_all(
        [Take("{t}:requests", requests, 1), Take("{t}:quota", quota, 0, binds=False)]
    )
    assert [v.allowed for v in looked] == [True, False]
    assert (await limiter.take("{t}:requests", requests, 0)).remaining == 9  # taken


async def test_a_million_names_cost_bounded_memory(clock: Clock) -> None:
    memory = MemoryLimiter(max_keys=1000, clock=clock)
    for i in range(100_000):
        await memory.take(f"tenant-{i}", PER_SECOND, 60)
    assert len(memory) == 1000
    # The least recently used are forgotten (their bucket found full), the latest kept.
    assert (await memory.take("tenant-0", PER_SECOND, 60)).allowed
    assert not (await memory.take("tenant-99999", PER_SECOND, 1)).allowed


async def test_a_key_in_use_outlives_newer_idle_ones(clock: Clock) -> None:
    memory = MemoryLimiter(max_keys=3, clock=clock)
    for name in ("a", "b", "c"):
        await memory.take(name, PER_SECOND, 60)
    await memory.take("a", PER_SECOND, 1)  # refused, but seen: the most recent now
    await memory.take("d", PER_SECOND, 60)
    assert not (await memory.take("a", PER_SECOND, 1)).allowed  # kept
    assert (await memory.take("b", PER_SECOND, 60)).allowed  # forgotten: full


async def test_rates_costs_and_sizes_are_checked() -> None:
    with pytest.raises(ValueError):
        Rate(0)
    with pytest.raises(ValueError):
        MemoryLimiter(max_keys=0)
    with pytest.raises(ValueError):
        await MemoryLimiter().take("t", PER_SECOND, -1)


async def test_redis_keys_keep_any_name_in_its_place() -> None:
    """Built without a command sent: nothing needs a server here."""
    client = connect(RedisGateConfig(url="redis://127.0.0.1:1/0"), None, max_connections=1)
    limiter = RedisLimiter(client, "pdgw:tenants")
    try:
        names = ["tokens:acme", "a b", "a\nb", "{slot}", "%41", "A", "é", "\udc80", "x" * 100]
        keys = [limiter.redis_key(name) for name in names]
        assert keys[0] == "pdgw:tenants:tokens:acme"
        assert keys[3] == "pdgw:tenants:{slot}"  # a hash tag is kept
        assert len(set(keys)) == len(names)
        for key in keys:
            assert key.startswith("pdgw:tenants:")
            assert key.isascii() and not any(c.isspace() for c in key)
    finally:
        await limiter.close()


# On Redis: the same behaviour on Redis's clock, which the tests cannot move.

DEPLOYMENTS = [
    pytest.param("single", marks=pytest.mark.e2e),
    pytest.param("cluster", marks=pytest.mark.e2e),
]
Limiters = Callable[..., RedisLimiter]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with running_redis() as server:
        yield server


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[LocalCluster]:
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
async def limiters() -> AsyncIterator[Limiters]:
    """`limiters(url, **settings)`: a RedisLimiter on its own client (a replica of its own),
    with this test's own prefix; all closed after the test."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:tenants"
    built: list[RedisLimiter] = []

    def build(url: str, **settings: float) -> RedisLimiter:
        config = RedisGateConfig(url=url, **settings)  # type: ignore[arg-type]
        redis = connect(config, None, max_connections=4)
        built.append(RedisLimiter(redis, prefix, max_calls=4))
        return built[-1]

    yield build
    for limiter in built:
        await limiter.close()


async def read(url: str, command: Callable[[RedisClient], Awaitable[int]]) -> int:
    """`command` on a client of the test's own."""
    redis = connect(RedisGateConfig(url=url), None, max_connections=1)
    try:
        return await redis.run(command)
    finally:
        await redis.aclose()


@pytest.fixture(params=DEPLOYMENTS)
def redis_url(request: pytest.FixtureRequest) -> str:
    fixture = "redis_server" if request.param == "single" else "redis_cluster"
    url: str = request.getfixturevalue(fixture).url
    return url


async def test_redis_a_minutes_worth_at_once_then_refused(
    redis_url: str, limiters: Limiters
) -> None:
    limiter = limiters(redis_url)
    assert await limiter.take("t", PER_SECOND, 1) == Verdict(True, 60, 59, 1.0, 0.0)
    rest = await limiter.take("t", PER_SECOND, 59)
    assert rest.allowed and rest.remaining == 0 and 59 < rest.reset_s <= 60
    refused = await limiter.take("t", PER_SECOND, 1)
    assert not refused.allowed and refused.limit == 60 and refused.remaining == 0
    assert 0 < refused.retry_after_s <= 1.5
    assert 58.5 < refused.reset_s <= 60


async def test_redis_the_bucket_refills_at_the_rate(redis_url: str, limiters: Limiters) -> None:
    limiter = limiters(redis_url)
    ten_a_second = Rate(600)
    assert (await limiter.take("t", ten_a_second, 600)).allowed
    assert not (await limiter.take("t", ten_a_second, 1)).allowed
    await asyncio.sleep(0.5)  # refills 5 units: 2 fit with a wide margin
    refilled = await limiter.take("t", ten_a_second, 2)
    assert refilled.allowed and refilled.remaining < 600


async def test_redis_a_cost_above_the_limit_never_fits(redis_url: str, limiters: Limiters) -> None:
    limiter = limiters(redis_url)
    hundred = Rate(100)
    assert await limiter.take("t", hundred, 101) == Verdict(False, 100, 100, 0.0, 0.0)
    assert (await limiter.take("t", hundred, 50)).allowed
    refused = await limiter.take("t", hundred, 101)
    assert not refused.allowed and 29 < refused.retry_after_s <= 30
    assert refused.retry_after_s == refused.reset_s  # until the bucket is full
    assert 49 <= (await limiter.take("t", hundred, 0)).remaining <= 51  # unchanged


async def test_redis_settle_charges_and_refunds_and_the_key_expires(
    redis_url: str, limiters: Limiters
) -> None:
    limiter = limiters(redis_url)
    key = limiter.redis_key("t")
    assert (await limiter.take("t", PER_SECOND, 10)).remaining == 50
    # Expires once the bucket is full again: 10 s from now.
    assert 8_000 < await read(redis_url, lambda client: client.pttl(key)) <= 10_000
    await limiter.settle("t", PER_SECOND, 30)
    assert 19 <= (await limiter.take("t", PER_SECOND, 0)).remaining <= 20
    assert 38_000 < await read(redis_url, lambda client: client.pttl(key)) <= 40_000
    await limiter.settle("t", PER_SECOND, 100)  # unchecked: past the minute
    owing = await limiter.take("t", PER_SECOND, 1)
    assert not owing.allowed and 79 < owing.retry_after_s <= 81

    await limiter.settle("t", PER_SECOND, -1000)  # never past full: the key goes
    assert await read(redis_url, lambda client: client.exists(key)) == 0
    assert await limiter.take("t", PER_SECOND, 0) == Verdict(True, 60, 60, 0.0, 0.0)
    assert (await limiter.take("t", PER_SECOND, 60)).allowed
    assert not (await limiter.take("t", PER_SECOND, 1)).allowed


async def test_redis_takes_together_are_all_taken_or_none(
    redis_url: str, limiters: Limiters
) -> None:
    await all_or_none(limiters(redis_url))


async def test_redis_replicas_share_one_bucket(redis_url: str, limiters: Limiters) -> None:
    """Two replicas, each with its own client: 100 calls at once, 60 taken in all."""
    a, b = limiters(redis_url), limiters(redis_url)
    started = time.monotonic()
    assert (await a.take("t", PER_SECOND, 20)).remaining == 40
    assert 39 <= (await b.take("t", PER_SECOND, 0)).remaining <= 40
    verdicts = await asyncio.gather(
        *(replica.take("t", PER_SECOND, 1) for _ in range(50) for replica in (a, b))
    )
    refilled = math.floor(time.monotonic() - started)  # one unit back a second (0 here, mostly)
    assert 40 <= sum(v.allowed for v in verdicts) <= 40 + refilled


async def test_redis_names_of_any_text_are_distinct_buckets(
    redis_url: str, limiters: Limiters
) -> None:
    limiter = limiters(redis_url)
    names = ["a b", "a\nb", "{slot}", "%41", "A", "é", "\udc80"]
    for name in names:
        assert (await limiter.take(name, PER_SECOND, 30)).remaining == 30
    for name in names:
        assert 29 <= (await limiter.take(name, PER_SECOND, 0)).remaining <= 30


@pytest.mark.parametrize(
    ("stored", "version"),
    [("2:1700000000000", "2"), ("1:5", "?"), ("full", "?")],
)
async def test_redis_a_bucket_of_a_version_this_release_does_not_read_is_refused_untouched(
    redis_url: str, limiters: Limiters, stored: str, version: str
) -> None:
    """Version 1 is the TAT alone; a later version (`2:...`) or a value of none refuses
    the whole call before it writes anything, rather than take the bucket for full."""
    limiter = limiters(redis_url)
    fine, unread = limiter.redis_key("{t}:requests"), limiter.redis_key("{t}:tokens")
    redis = connect(RedisGateConfig(url=redis_url), None, max_connections=1)
    try:
        await redis.run(lambda client: client.set(unread, stored))
        both = [Take("{t}:requests", PER_SECOND, 1), Take("{t}:tokens", PER_SECOND, 1)]
        with pytest.raises(LimiterUnreadable) as refused:
            await limiter.take_all(both)
        assert refused.value.version == version
        assert f"format version {version!r}; this release reads [1]" in str(refused.value)
        with pytest.raises(LimiterUnreadable):
            await limiter.settle("{t}:tokens", PER_SECOND, 5)
        assert await redis.run(lambda client: client.exists(fine)) == 0
        assert await redis.run(lambda client: client.get(unread)) == stored
    finally:
        await redis.aclose()


@pytest.mark.e2e
async def test_a_cancelled_caller_leaves_its_call_to_finish(
    redis_server: RedisServer, limiters: Limiters
) -> None:
    limiter, other = limiters(redis_server.url), limiters(redis_server.url)
    caller = asyncio.create_task(limiter.take("t", PER_SECOND, 1))
    await asyncio.sleep(0)  # the call is under way
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await limiter.close()  # once the call has ended
    assert 58 <= (await other.take("t", PER_SECOND, 0)).remaining <= 59


@pytest.mark.e2e
async def test_a_stopped_redis_is_unavailable_within_the_socket_timeout(
    limiters: Limiters,
) -> None:
    server = RedisServer()
    server.start()
    try:
        limiter = limiters(server.url, socket_timeout_s=0.5)
        assert (await limiter.take("t", PER_SECOND, 1)).allowed
        server.stop()
        started = time.monotonic()
        with pytest.raises(LimiterUnavailable) as unavailable:
            await limiter.take("t", PER_SECOND, 1)
        with pytest.raises(LimiterUnavailable):
            await limiter.settle("t", PER_SECOND, 5)
        assert time.monotonic() - started < 0.5
        assert unavailable.value.__cause__ is not None
    finally:
        server.close()


@pytest.mark.e2e
async def test_a_redis_that_stops_answering_is_unavailable_after_the_socket_timeout(
    redis_server: RedisServer, limiters: Limiters
) -> None:
    async with PartitionableLink("127.0.0.1", redis_server.port) as link:
        limiter = limiters(link.url, socket_timeout_s=0.5)
        assert (await limiter.take("t", PER_SECOND, 1)).allowed
        link.cut()
        started = time.monotonic()
        with pytest.raises(LimiterUnavailable) as unavailable:
            await limiter.take("t", PER_SECOND, 1)
        assert 0.4 < time.monotonic() - started < 1.5
        assert isinstance(unavailable.value.__cause__, TimeoutError)
