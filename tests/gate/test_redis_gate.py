"""The Redis backend across replicas: several gates on one real Redis server (or one real
Redis Cluster), as several gateway processes would be. The interface suite (test_gate.py,
test_health.py) runs on this backend too; these are the properties only a shared backend
has. Tests that stop, lock or cut off their own server run on a single server."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError

from router.config import GateConfig, RedisGateConfig
from router.gate import GateRejected, NodeFailure, ProbeClaim, Share, make_gate
from router.gate.redis import GateUnavailable, RedisGate, RedisLease
from router.gate.redis.client import RedisClient, connect
from router.node import Node
from tests.gate.conftest import DEPLOYMENTS, eventually, nodes, waiting
from tests.gate.partition import PartitionableLink
from tests.gate.redis_deployments import LocalCluster
from tests.gate.redis_server import RedisServer, free_port

pytestmark = pytest.mark.e2e  # every test here runs a redis-server

# Short enough that expiry-based recovery takes well under a second.
FAST = {"lease_ttl_s": 0.6, "renew_every_s": 0.2, "poll_s": 0.1, "socket_timeout_s": 0.5}

Replica = Callable[..., RedisGate]


def replicas_on(url: str, prefix: str, built: list[RedisGate]) -> Replica:
    def build(
        node_list: list[Node], *, max_queue: int = 64, pool_id: str = "", **settings: float
    ) -> RedisGate:
        config = GateConfig(
            backend="redis",
            redis=RedisGateConfig(url=url, key_prefix=prefix, **settings),  # type: ignore[arg-type]
            max_queue=max_queue,
        )
        gate = make_gate(config, node_list, pool_id=pool_id)
        assert isinstance(gate, RedisGate)
        built.append(gate)
        return gate

    return build


@pytest.fixture(params=DEPLOYMENTS)
def redis_url(request: pytest.FixtureRequest) -> str:
    """The URL of a shared Redis deployment: a single server, or a Cluster."""
    return str(request.getfixturevalue(request.param).url)


@pytest.fixture
async def replica(redis_url: str, key_prefix: str) -> AsyncIterator[Replica]:
    """`replica(node_list, max_queue=..., **redis_settings)`: one more gateway replica."""
    built: list[RedisGate] = []
    yield replicas_on(redis_url, key_prefix, built)
    for gate in built:
        await gate.close()


@pytest.fixture
def own_server() -> Iterator[Callable[..., RedisServer]]:
    """`own_server(*redis_server_args)`: a server of the test's own, to stop or to lock."""
    servers: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        servers.append(RedisServer(extra_args=list(args)))
        servers[-1].start()
        return servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[RedisClient]:
    """A plain client of the deployment the test's replicas share."""
    client = connect(RedisGateConfig(url=redis_url), None, max_connections=4)
    yield await client.settled()
    await client.aclose()


def kill(gate: RedisGate) -> None:
    """The replica's process dies: from now on nothing it would do reaches Redis (no
    heartbeat, no renewal, no withdrawal of its waiters)."""

    async def unreachable(*_: Any, **__: Any) -> Any:
        raise RedisConnectionError("this replica is dead")

    def started(*_: Any, **__: Any) -> asyncio.Future[Any]:
        return asyncio.ensure_future(unreachable())

    gate.scripts.run = unreachable  # type: ignore[method-assign]
    gate.scripts.start = started  # type: ignore[method-assign]


async def listening(client: RedisClient, channel: str) -> PubSub:
    """A subscriber of `channel`, once the server has confirmed it."""
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    async with asyncio.timeout(5):
        while (message := await pubsub.get_message(timeout=5)) is None:
            pass
    assert message["type"] == "subscribe"
    return pubsub


async def heard_so_far(client: RedisClient, pubsub: PubSub, channel: str) -> list[str]:
    """What `pubsub` has heard on `channel`: everything before a mark published now."""
    await client.publish(channel, "mark")
    heard = []
    async with asyncio.timeout(5):
        while (message := await pubsub.get_message(timeout=5)) is None or (
            message["data"] != "mark"
        ):
            if message is not None:
                heard.append(message["data"])
    return heard


async def test_two_replicas_never_hold_one_node_at_once(replica: Replica) -> None:
    pool = nodes(3)
    # However slow a loaded host is to answer, no call is given up: nothing is refused.
    patient = {"socket_timeout_s": 10.0}
    gates = [replica(pool, max_queue=200, **patient), replica(pool, max_queue=200, **patient)]
    rng = random.Random(7)
    in_use: set[str] = set()
    tokens: dict[str, list[int]] = {n.id: [] for n in pool}
    served: list[int] = []
    quits_holding = set(rng.sample(range(120), 20))  # its client leaves mid-request

    async def request(gate: RedisGate, i: int) -> None:
        lease = await gate.acquire(priority=rng.randint(0, 3), wait_s=30, holder=f"r{i}")
        assert isinstance(lease, RedisLease)
        node = lease.node.id
        try:
            assert node not in in_use, f"{node} held twice"
            in_use.add(node)
            tokens[node].append(lease.grant.token)
            if i in quits_holding:
                asyncio.current_task().cancel()  # type: ignore[union-attr]
            for _ in range(rng.randint(1, 6)):  # the request runs for a few turns
                await asyncio.sleep(0)
            served.append(i)
        finally:
            in_use.discard(node)
            await lease.release()

    tasks = [asyncio.create_task(request(gates[i % 2], i)) for i in range(120)]
    for task in rng.sample([t for i, t in enumerate(tasks) if i not in quits_holding], 30):
        for _ in range(rng.randint(0, 30)):  # cancelled at scattered moments of its wait
            await asyncio.sleep(0)
        task.cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
    assert [r for r in results if not (r is None or isinstance(r, asyncio.CancelledError))] == []
    assert len(served) >= 120 - 20 - 30 and not quits_holding & set(served)
    for node, granted in tokens.items():  # fencing tokens grow with every grant of a node
        assert granted == sorted(granted) and len(set(granted)) == len(granted), node
    assert sum(map(len, tokens.values())) >= 120 - 30  # every other request held a node
    for gate in gates:
        snapshot = await gate.snapshot()
        assert snapshot.busy == dict.fromkeys(snapshot.busy)  # nothing held, nothing reserved
        assert snapshot.waiting == 0


async def test_two_replicas_keep_every_tenants_cap_and_never_double_book(
    replica: Replica,
) -> None:
    """Tenants of random weights and caps, on two replicas, with waiters that give up: no
    node is ever held twice, no tenant ever holds more than its cap, and nothing is left."""
    pool = nodes(4)
    patient = {"socket_timeout_s": 10.0}
    gates = [replica(pool, max_queue=200, **patient), replica(pool, max_queue=200, **patient)]
    rng = random.Random(11)
    shares = [
        Share("capped-1", weight=1.0, max_nodes=1),
        Share("capped-2", weight=2.0, max_nodes=2),
        Share("heavy", weight=4.0),
        Share("light", weight=0.5),
    ]
    in_use: set[str] = set()
    holding: dict[str, int] = {}
    served: list[int] = []

    async def request(gate: RedisGate, i: int) -> None:
        share = shares[i % len(shares)]
        lease = await gate.acquire(
            priority=rng.randint(0, 1), wait_s=30, holder=f"r{i}", share=share
        )
        node = lease.node.id
        try:
            assert node not in in_use, f"{node} held twice"
            in_use.add(node)
            holding[share.tenant] = holding.get(share.tenant, 0) + 1
            cap = share.max_nodes
            assert cap is None or holding[share.tenant] <= cap, (share, holding)
            for _ in range(rng.randint(1, 6)):  # the request runs for a few turns
                await asyncio.sleep(0)
            served.append(i)
        finally:
            in_use.discard(node)
            holding[share.tenant] -= 1
            await lease.release()

    tasks = [asyncio.create_task(request(gates[i % 2], i)) for i in range(120)]
    for task in rng.sample(tasks, 20):
        for _ in range(rng.randint(0, 30)):  # cancelled at scattered moments of its wait
            await asyncio.sleep(0)
        task.cancel()
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
    assert [r for r in results if not (r is None or isinstance(r, asyncio.CancelledError))] == []
    assert len(served) >= 100
    assert {s.tenant for s in shares} <= {shares[i % 4].tenant for i in served}
    for gate in gates:
        snapshot = await gate.snapshot()
        assert snapshot.busy == dict.fromkeys(snapshot.busy)
        assert snapshot.waiting == 0


async def test_service_order_is_global_priority_then_arrival(replica: Replica) -> None:
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    held = await a.acquire(priority=0, wait_s=1, holder="first")
    order: list[str] = []

    async def wait(gate: RedisGate, name: str, priority: int) -> None:
        lease = await gate.acquire(priority=priority, wait_s=10, holder=name)
        order.append(name)
        await lease.release()

    arrivals = [(a, "low1", 0), (b, "high1", 5), (b, "low2", 0), (a, "high2", 5), (b, "mid", 2)]
    tasks = []
    for gate, name, priority in arrivals:
        tasks.append(asyncio.create_task(wait(gate, name, priority)))
        await waiting(a, len(tasks))  # either replica sees the one queue
    assert (await b.snapshot()).waiting == len(tasks)
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == ["high1", "high2", "mid", "low1", "low2"]


async def test_service_order_is_global_earliest_deadline_within_a_priority(
    replica: Replica,
) -> None:
    """Each replica's waiters are placed by when they are due on the server's one clock:
    on arrival, or at their deadline."""
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    held = await a.acquire(priority=0, wait_s=1, holder="first")
    order: list[str] = []

    async def wait(gate: RedisGate, name: str, wait_s: float, deadline_s: float | None) -> None:
        lease = await gate.acquire(priority=0, wait_s=wait_s, holder=name, deadline_s=deadline_s)
        order.append(name)
        await lease.release()

    arrivals = [(a, "late", 60, 40), (b, "patient", 60, None), (b, "soon", 60, 10)]
    arrivals += [(a, "hurried", 20, None)]
    tasks = []
    for gate, name, wait_s, deadline_s in arrivals:
        tasks.append(asyncio.create_task(wait(gate, name, wait_s, deadline_s)))
        await waiting(a, len(tasks))
    await held.release()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert order == ["patient", "hurried", "soon", "late"]


async def test_a_tenants_cap_and_share_hold_across_replicas(replica: Replica) -> None:
    """What one replica's requests hold counts on every replica: the cap refuses there, and
    the node time held puts another replica's waiter of that tenant behind."""
    pool = nodes(2)
    a, b = replica(pool), replica(pool)
    capped = Share("capped", max_nodes=1)
    held = await a.acquire(priority=0, wait_s=1, holder="held-on-a", share=capped)
    with pytest.raises(GateRejected) as refused:
        await b.acquire(priority=0, wait_s=0, holder="refused-on-b", share=capped)
    assert refused.value.reason == "tenant_max_nodes"
    other = await b.acquire(priority=0, wait_s=1, holder="other", share=Share("other"))
    first = asyncio.create_task(b.acquire(priority=0, wait_s=10, holder="capped-b", share=capped))
    await waiting(a, 1)
    second = asyncio.create_task(
        a.acquire(priority=0, wait_s=10, holder="fresh-a", share=Share("fresh"))
    )
    await waiting(a, 2)
    await other.release()  # the capped tenant waits first, and holds a node: `fresh` goes
    lease = await asyncio.wait_for(second, 10)
    assert not first.done()
    await held.release()
    capped_lease = await asyncio.wait_for(first, 10)
    await lease.release()
    await capped_lease.release()


async def test_a_release_hands_the_node_to_a_waiter_of_its_own_replica_in_its_reply(
    replica: Replica,
) -> None:
    """No wake-up message and no claim: the release's reply carries the grant. A waiter of
    another replica is still woken by the channel and claims its node."""
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    local = asyncio.create_task(a.acquire(priority=1, wait_s=10, holder="local"))
    remote = asyncio.create_task(b.acquire(priority=0, wait_s=10, holder="remote"))
    await waiting(a, 2)
    claims = a.scripts.run

    async def counted(script: str, **args: Any) -> Any:
        assert script != "claim", "the local waiter needs no claim"
        return await claims(script, **args)

    a.scripts.run = counted  # type: ignore[method-assign]
    await held.release()
    lease = await asyncio.wait_for(local, 5)
    a.scripts.run = claims  # type: ignore[method-assign]
    assert lease.holder == "local" and lease.node == held.node
    assert (await b.snapshot()).busy == {held.node.id: "local"}
    assert await lease.renew() is True
    await lease.release()
    assert (await asyncio.wait_for(remote, 5)).holder == "remote"


async def test_a_waiter_of_another_replica_is_handed_the_node_its_replica_claimed_for_it(
    replica: Replica,
) -> None:
    """The release's message names the waiter; its replica's listener claims the node for
    it and hands it over: the waiter itself claims only once, as it starts waiting (its
    poll is 30 s away)."""
    pool = nodes(1)
    a, b = replica(pool), replica(pool, poll_s=30)
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    claims = 0
    run = b.scripts.run

    async def counted(script: str, **args: Any) -> Any:
        nonlocal claims
        claims += script == "claim"
        return await run(script, **args)

    b.scripts.run = counted  # type: ignore[method-assign]
    remote = asyncio.create_task(b.acquire(priority=0, wait_s=10, holder="remote"))
    await eventually(lambda: claims == 1)
    await held.release()
    lease = await asyncio.wait_for(remote, 5)
    assert claims == 1
    assert lease.holder == "remote" and lease.node == held.node
    assert (await a.snapshot()).busy == {held.node.id: "remote"}
    assert await lease.renew() is True
    await lease.release()
    assert (await a.snapshot()).busy == {held.node.id: None}


@pytest.mark.parametrize("listed", [True, False], ids=["in-its-pool", "not-in-its-pool-yet"])
async def test_a_claim_crossing_the_collection_leaves_no_place_in_the_queue(
    replica: Replica, listed: bool
) -> None:
    """The waiter's own claim runs after its replica's collection and is answered before it:
    the waiter has its node once, and no place of its left in the queue takes the next node
    freed, whether the node is one its replica lists or one another replica added."""
    pool, added = nodes(1), nodes(2)[1]
    a, b = replica(pool), replica(pool, poll_s=30)
    await a.set_nodes([*pool, added])
    if listed:
        await b.set_nodes([*pool, added])
    first, second = [await a.acquire(priority=0, wait_s=1, holder="held") for _ in "12"]
    held = {first.node: first, second.node: second}
    start, run = b.scripts.start, b.scripts.run
    collected: list[Callable[[], None]] = []

    def collection_answered_late(script: str, **args: Any) -> Any:
        if script == "collect":
            hand_over = args["on_reply"]
            owners = args["owners"].split()

            def late(reply: Any) -> None:  # the waiter claims first
                collected.append(lambda: hand_over(reply))
                b._waiters.wake(owners)

            args["on_reply"] = late
        return start(script, **args)

    claims = 0

    async def then_the_collection(script: str, **args: Any) -> Any:
        nonlocal claims
        reply = await run(script, **args)
        if script == "claim":
            claims += 1
            if collected:
                collected.pop()()
        return reply

    b.scripts.start = collection_answered_late  # type: ignore[method-assign]
    b.scripts.run = then_the_collection  # type: ignore[method-assign]
    waiter = asyncio.create_task(b.acquire(priority=0, wait_s=10, holder="waiter"))
    await eventually(lambda: claims == 1)  # queued, and its first claim found nothing yet
    await held.pop(added).release()
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.node == added
    assert not collected  # answered after the waiter's claim
    assert (await a.snapshot()).waiting == 0
    await lease.release()
    await held.pop(pool[0]).release()
    assert (await a.snapshot()).busy == {pool[0].id: None, added.id: None}


async def test_a_place_left_without_its_waiter_passes_its_node_on_when_named(
    replica: Replica,
) -> None:
    """A place in the queue whose waiter has gone (one queued again behind its back) is
    granted the node freed; its replica, named it, passes the node on at once, not after
    the grant's claim window (30 s here)."""
    pool = nodes(1)
    a, b = replica(pool, poll_s=30, lease_ttl_s=60), replica(pool)
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    with pytest.raises(GateRejected):
        await b.acquire(priority=0, wait_s=0, holder="starts-its-listener")
    await eventually(b._waiters.subscribed.is_set)
    place = f"{b.replica}|left"
    queued = await b.scripts.run(
        "acquire",
        owner=place,
        holder="left",
        priority=0,
        wait_ms=60_000,
        due_ms=0,  # ahead of `behind`
        max_queue=64,
        share="",
    )
    assert queued[0] == "queued"
    behind = asyncio.create_task(a.acquire(priority=0, wait_s=30, holder="behind"))
    await waiting(a, 2)
    await held.release()  # to the place left
    lease = await asyncio.wait_for(behind, 10)
    assert lease.node == held.node
    assert (await a.snapshot()).waiting == 0
    await lease.release()


async def test_a_collection_claims_only_grants_and_queues_nobody(replica: Replica) -> None:
    """A waiter that has gone, or never waited, gets no node and no place in the queue from
    its replica's collection."""
    pool = nodes(1)
    gate = replica(pool)
    held = await gate.acquire(priority=0, wait_s=1, holder="held")
    owner = f"{gate.replica}|gone"
    await gate.scripts.run("abandon", owner=owner, node="")
    assert await gate.scripts.run("collect", owners=f"{owner}\n{gate.replica}|never") == []
    assert (await gate.snapshot()).waiting == 0
    await held.release()
    assert (await gate.snapshot()).busy == {held.node.id: None}


async def test_a_grant_is_named_only_to_its_waiters_replica(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """A release names the waiter it granted a node to on the waiter's replica's own
    channel: the deployment's channel, which every replica hears, carries nothing, and the
    waiter has its node long before its poll (30 s away)."""
    built: list[RedisGate] = []
    connection = connect(RedisGateConfig(url=redis_server.url), None, max_connections=2)
    client = await connection.settled()
    shared = None
    try:
        pool = nodes(1)
        a, b = (replicas_on(redis_server.url, key_prefix, built)(pool, poll_s=30) for _ in "ab")
        held = await a.acquire(priority=0, wait_s=1, holder="held")
        shared = await listening(client, a.keys.channel)
        remote = asyncio.create_task(b.acquire(priority=0, wait_s=10, holder="remote"))
        await waiting(a, 1)
        await held.release()
        lease = await asyncio.wait_for(remote, 5)
        assert lease.node == held.node
        assert await heard_so_far(client, shared, a.keys.channel) == []
        await lease.release()
    finally:
        if shared is not None:
            await shared.aclose()  # type: ignore[no-untyped-call, unused-ignore]
        for gate in built:
            await gate.close()
        await connection.aclose()


async def test_a_waiter_of_a_replica_heard_only_on_the_deployments_channel_is_named_there(
    replica: Replica, redis_client: RedisClient
) -> None:
    """A replica of an earlier release listens only on the deployment's channel: a grant
    to its waiter, which nobody hears on the replica's own channel, is named there, and the
    waiter has its node long before its poll (30 s away)."""
    pool = nodes(1)
    a, earlier = replica(pool), replica(pool, poll_s=30)
    earlier._waiters._channels = (earlier.keys.channel,)  # as an earlier release listened
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    shared = await listening(redis_client, a.keys.channel)
    try:
        remote = asyncio.create_task(earlier.acquire(priority=0, wait_s=10, holder="remote"))
        await waiting(a, 1)
        await held.release()
        lease = await asyncio.wait_for(remote, 5)
        heard = await heard_so_far(redis_client, shared, a.keys.channel)
        assert len(heard) == 1 and heard[0].startswith(f"{earlier.replica}|"), heard
        await lease.release()
    finally:
        await shared.aclose()  # type: ignore[no-untyped-call, unused-ignore]


async def test_a_release_whose_request_is_cancelled_mid_call_still_hands_the_node_over(
    replica: Replica,
) -> None:
    """The hand-over runs from the release script's reply, not from the releasing task:
    that task cancelled while the script is on its way, the waiter still gets the node
    (long before its own poll, 30 s away, would find it)."""
    pool = nodes(1)
    gate = replica(pool, poll_s=30)
    held = await gate.acquire(priority=0, wait_s=1, holder="held")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=10, holder="next"))
    await waiting(gate, 1)
    releasing = asyncio.create_task(held.release())
    await asyncio.sleep(0)  # one turn: the task runs up to its wait for the script's reply
    assert held.released and not releasing.done()
    releasing.cancel()
    lease = await asyncio.wait_for(waiter, 5)
    assert releasing.cancelled()
    assert lease.holder == "next" and lease.node == held.node
    assert (await gate.snapshot()).busy == {held.node.id: "next"}
    await lease.release()


async def test_a_node_handed_over_before_its_waiter_has_seen_its_queued_reply_is_its(
    replica: Replica,
) -> None:
    """The release that grants the node runs between the acquire script queueing the waiter
    and the waiter beginning to wait: the node is still handed to it, never passed on while
    the waiter's own claim finds it by its lease (two requests on one node)."""
    pool = nodes(1)
    gate = replica(pool)
    held = await gate.acquire(priority=0, wait_s=1, holder="held")
    queued, go_on = asyncio.Event(), asyncio.Event()
    wait = gate._wait

    async def late_to_wait(*args: Any) -> RedisLease:
        queued.set()
        await go_on.wait()
        return await wait(*args)

    gate._wait = late_to_wait  # type: ignore[method-assign]
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=10, holder="late"))
    await asyncio.wait_for(queued.wait(), 5)
    await held.release()  # its reply hands the node over, to a waiter not yet waiting
    go_on.set()
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.holder == "late" and lease.node == held.node
    assert (await gate.snapshot()).busy == {held.node.id: "late"}
    assert await lease.renew() is True


async def test_a_waiter_cancelled_as_its_node_is_handed_over_passes_it_on(
    replica: Replica,
) -> None:
    pool = nodes(1)
    gate = replica(pool)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    first = asyncio.create_task(gate.acquire(priority=1, wait_s=60, holder="b"))
    second = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="c"))
    await waiting(gate, 2)
    hand_over = gate._waiters.hand_over

    def cancelled_as_handed(owner: str, node_id: str, token: int) -> bool:
        delivered = hand_over(owner, node_id, token)
        first.cancel()  # before the waiter could run
        return delivered

    gate._waiters.hand_over = cancelled_as_handed  # type: ignore[method-assign]
    await held.release()
    lease = await asyncio.wait_for(second, 5)
    assert first.cancelled()
    assert lease.holder == "c"
    assert (await gate.snapshot()).busy == {held.node.id: "c"}


async def test_a_landed_transfer_reaches_the_pool_long_before_the_next_renewal(
    replica: Replica, redis_client: RedisClient
) -> None:
    """A replica that dies just after its node answered still has it known as landed, so a
    0.1.5 node is not held out for the prefill's deadline."""
    gate = replica(nodes(1), lease_ttl_s=10, renew_every_s=5)
    lease = await gate.acquire(priority=0, wait_s=1, holder="rid")
    state_key = gate.keys.node(lease.node.id)[0]
    assert await redis_client.hget(state_key, "landed") is None
    lease.transfer_landed()

    async def told() -> bool:
        return await redis_client.hget(state_key, "landed") == str(lease.grant.token)

    await eventually(told, timeout_s=2.0)  # the next regular renewal is 5 s away
    await lease.release()


async def test_an_expired_lease_names_its_request_and_whether_its_transfer_may_still_land(
    replica: Replica,
) -> None:
    """A lease that expires during its prefill leaves the node out until the prober's quiet
    time has passed (the transfer may still arrive); one whose transfer had landed, as told
    with a renewal, is flushed at once. Either way the flush names the stale request."""
    pool = nodes(2)
    dead, alive = replica(pool, **FAST), replica(pool, **FAST)
    prefilling = await dead.acquire(priority=0, wait_s=1, holder="rid-prefilling")
    decoding = await dead.acquire(priority=0, wait_s=1, holder="rid-decoding")
    decoding.transfer_landed()
    assert await decoding.renew() is True  # the renewal tells the pool
    kill(dead)

    async def both_expired() -> bool:
        out = (await alive.snapshot()).out
        return out == dict.fromkeys((prefilling.node.id, decoding.node.id), "lease_expired")

    await eventually(both_expired)
    assert await alive.claim_for_probe(prefilling.node.id, for_s=30, quiet_s=60) is None
    assert await alive.claim_for_probe(decoding.node.id, for_s=30, quiet_s=60) == ProbeClaim(
        stale_rid="rid-decoding"
    )
    assert await alive.claim_for_probe(prefilling.node.id, for_s=30, quiet_s=0) == ProbeClaim(
        stale_rid="rid-prefilling"
    )
    for lease in (prefilling, decoding):
        await alive.readmit(lease.node.id)
    assert (await alive.snapshot()).out == {}
    # Readmitted and released cleanly: nothing stale is named any more.
    again = await alive.acquire(priority=0, wait_s=1, holder="rid-next")
    await again.release(NodeFailure("node_busy", hard=True))
    assert await alive.claim_for_probe(again.node.id, for_s=30, quiet_s=60) == ProbeClaim()


async def test_an_unrenewed_lease_expires_and_a_stale_release_is_refused(
    replica: Replica,
) -> None:
    pool = nodes(1)
    dead, alive = replica(pool, **FAST), replica(pool, **FAST)
    lost = await dead.acquire(priority=0, wait_s=1, holder="dead")
    assert isinstance(lost, RedisLease)
    run = dead.scripts.run
    kill(dead)  # stops renewing

    async def suspect() -> bool:  # once the TTL ran out: the node may hold an orphan
        return (await alive.snapshot()).out == {lost.node.id: "lease_expired"}

    await eventually(suspect)
    with pytest.raises(GateRejected):
        await alive.acquire(priority=0, wait_s=0, holder="too-soon")
    assert await alive.claim_for_probe(lost.node.id, for_s=30) is not None  # flushed: back
    await alive.readmit(lost.node.id)
    taken = await alive.acquire(priority=0, wait_s=5, holder="alive")
    assert isinstance(taken, RedisLease)
    assert taken.node == lost.node and taken.grant.token > lost.grant.token
    dead.scripts.run = run  # type: ignore[method-assign]  # the replica was only cut off: it is back
    assert await lost.renew() is False
    forged = RedisLease(
        dataclasses.replace(taken.grant, token=lost.grant.token),  # the holder, a stale token
        valid_until=0,
        renew=dead._upkeep.renew,
        release=dead._upkeep.release,
    )
    await forged.release()
    await lost.release()
    assert (await alive.snapshot()).busy == {taken.node.id: "alive"}
    assert await taken.renew() is True
    await taken.release()
    assert (await alive.snapshot()).busy == {taken.node.id: None}


@pytest.mark.parametrize("found_by", ["its replica's collection", "its own claim"])
async def test_a_grant_that_races_the_cancellation_is_passed_on(
    replica: Replica, found_by: str
) -> None:
    """The waiter, on another replica than the release, is cancelled as the reply that
    claims its node comes in: the node goes to the next waiter."""
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    first = asyncio.create_task(b.acquire(priority=1, wait_s=10, holder="first"))
    if found_by == "its own claim":  # the message only wakes it
        b._waiters._collect = b._waiters.wake  # type: ignore[method-assign]
        claim = b.scripts.run

        async def cancelled_as_granted(script: str, **args: Any) -> Any:
            reply = await claim(script, **args)
            if script == "claim" and reply[0] == "granted":
                asyncio.current_task().cancel()  # type: ignore[union-attr]  # lands with the reply
            return reply

        b.scripts.run = cancelled_as_granted  # type: ignore[method-assign]
    else:
        start = b.scripts.start

        def cancelled_as_collected(script: str, **args: Any) -> Any:
            if script == "collect":
                hand_over = args["on_reply"]
                args["on_reply"] = lambda reply: (first.cancel(), hand_over(reply))
            return start(script, **args)

        b.scripts.start = cancelled_as_collected  # type: ignore[method-assign]
    await waiting(a, 1)
    second = asyncio.create_task(a.acquire(priority=0, wait_s=10, holder="second"))
    await waiting(a, 2)
    await held.release()  # to `first`, on the other replica
    lease = await asyncio.wait_for(second, 5)
    assert first.cancelled()
    assert lease.node == held.node
    assert (await a.snapshot()).busy == {held.node.id: "second"}


async def test_a_dead_replicas_waiters_stop_blocking_others(
    replica: Replica, redis_client: RedisClient
) -> None:
    pool = nodes(1)
    holder, dead, other = replica(pool, **FAST), replica(pool, **FAST), replica(pool, **FAST)
    held = await holder.acquire(priority=0, wait_s=1, holder="held")
    ahead = [
        asyncio.create_task(dead.acquire(priority=9, wait_s=30, holder=f"dead{i}"))
        for i in range(3)
    ]
    await waiting(holder, 3)
    behind = asyncio.create_task(other.acquire(priority=0, wait_s=30, holder="behind"))
    await waiting(holder, 4)
    kill(dead)
    for task in ahead:  # the process is gone: its waiters never withdraw
        task.cancel()
    await asyncio.gather(*ahead, return_exceptions=True)
    assert await redis_client.zcard(dead.pool_keys.queue) == 4

    async def heartbeat_gone() -> bool:
        seconds, microseconds = await redis_client.time()
        until_ms = await redis_client.zscore(dead.keys.alive, dead.replica)
        return until_ms is None or until_ms < seconds * 1000 + microseconds // 1000

    await eventually(heartbeat_gone)
    await waiting(holder, 1)  # only `behind` still counts
    await held.release()
    lease = await asyncio.wait_for(behind, 5)
    assert lease.node == held.node
    assert await redis_client.zcard(dead.pool_keys.queue) == 0


async def test_a_dead_replicas_grants_go_to_the_next_waiters_before_its_heartbeat_ends(
    replica: Replica, redis_client: RedisClient
) -> None:
    pool = nodes(2)
    # The dead replica's heartbeat outlives the test; its grants' claim window does not.
    settings = {**FAST, "lease_ttl_s": 8.0, "renew_every_s": 2.0}
    holder, dead, other = (replica(pool, **settings) for _ in range(3))
    held = [await holder.acquire(priority=0, wait_s=1, holder=f"held{i}") for i in range(2)]
    ahead = [
        asyncio.create_task(dead.acquire(priority=9, wait_s=30, holder=f"dead{i}"))
        for i in range(4)
    ]
    await waiting(holder, 4)
    behind = [
        asyncio.create_task(other.acquire(priority=0, wait_s=30, holder=f"behind{i}"))
        for i in range(2)
    ]
    await waiting(holder, 6)
    kill(dead)
    for task in ahead:  # the process is gone: its waiters never withdraw
        task.cancel()
    await asyncio.gather(*ahead, return_exceptions=True)
    killed_at = time.monotonic()
    for lease in held:
        await lease.release()  # each node goes to one of the dead replica's waiters first
    leases = await asyncio.wait_for(asyncio.gather(*behind), 4)
    assert time.monotonic() - killed_at < settings["lease_ttl_s"]  # its heartbeat still ran
    assert {lease.node for lease in leases} == set(pool)
    snapshot = await holder.snapshot()
    assert snapshot.out == {}, "a node granted and never claimed was never used: no flush"
    assert snapshot.waiting == 0
    assert await redis_client.hlen(dead.pool_keys.grants) == 0
    assert await redis_client.zscore(dead.keys.alive, dead.replica) is None
    for lease in leases:
        await lease.release()


async def test_a_waiter_that_missed_its_claim_window_is_served_later_in_turn(
    replica: Replica,
) -> None:
    pool = nodes(1)
    holder, other = replica(pool, **FAST), replica(pool, **FAST)
    # Its wake-ups are lost and it polls rarely: a grant's window passes before it looks.
    slow = replica(pool, **{**FAST, "poll_s": 2.0, "lease_ttl_s": 8.0, "renew_every_s": 2.0})
    slow._waiters._heard = lambda owners: None  # type: ignore[method-assign]
    claims = 0
    run = slow.scripts.run

    async def counted(script: str, **args: Any) -> Any:
        nonlocal claims
        reply = await run(script, **args)
        claims += script == "claim"
        return reply

    slow.scripts.run = counted  # type: ignore[method-assign]
    held = await holder.acquire(priority=0, wait_s=1, holder="held")
    late = asyncio.create_task(slow.acquire(priority=5, wait_s=30, holder="slow"))
    await eventually(lambda: claims == 1)  # it has looked once, and looks again in 2 s
    await held.release()  # granted to the slow waiter, which does not claim it in time
    lease = await asyncio.wait_for(other.acquire(priority=0, wait_s=5, holder="other"), 5)
    assert lease.node == held.node
    assert (await holder.snapshot()).out == {}
    assert not late.done()
    await lease.release()
    served = await asyncio.wait_for(late, 10)  # back in the queue at its next claim
    assert served.node == held.node
    assert (await holder.snapshot()).busy == {held.node.id: "slow"}
    await served.release()


async def test_closing_a_replica_withdraws_its_waiters(replica: Replica) -> None:
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    waiter = asyncio.create_task(b.acquire(priority=5, wait_s=30, holder="b"))
    await waiting(a, 1)
    await b.close()
    with pytest.raises(GateRejected) as closed:
        await waiter
    assert closed.value.reason == "gate_unavailable"
    assert (await a.snapshot()).waiting == 0
    await held.release()
    assert (await a.snapshot()).busy == {held.node.id: None}


async def test_redis_down_means_gate_unavailable_and_the_gate_recovers(
    key_prefix: str, own_server: Callable[..., RedisServer]
) -> None:
    server = own_server()
    built: list[RedisGate] = []
    try:
        gate = replicas_on(server.url, key_prefix, built)(nodes(1), **FAST)
        held = await gate.acquire(priority=0, wait_s=1, holder="held")
        waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=30, holder="waiter"))
        await waiting(gate, 1)
        server.stop()
        with pytest.raises(GateRejected) as queued:
            await asyncio.wait_for(waiter, 5)  # its next poll fails
        assert queued.value.reason == "gate_unavailable"
        with pytest.raises(GateRejected) as fresh:
            await gate.acquire(priority=0, wait_s=5, holder="fresh")
        assert fresh.value.reason == "gate_unavailable" and fresh.value.retry_after_s >= 1
        assert await gate.retry_after_s() >= 1
        snapshot = await gate.snapshot()
        assert snapshot.out == {held.node.id: "gate_unavailable"}
        assert await gate.due_for_probe() == []
        await gate.take_out(held.node.id, "not_ready_at_start")  # logged, not raised
        with pytest.raises(GateUnavailable):
            await gate.drain(held.node.id)
        await held.release()  # logged: the lease expires by itself

        server.start()  # same port, empty: the pool's leases are gone with the data
        # The node might still be serving a lease Redis forgot: out until flushed, while
        # requests wait for it (a prober would claim, flush and readmit it).
        after = asyncio.create_task(gate.acquire(priority=0, wait_s=5, holder="after"))
        await waiting(gate, 1)
        assert (await gate.snapshot()).out == {held.node.id: "state_lost"}
        assert [n.id for n in await gate.due_for_probe()] == [held.node.id]
        assert await gate.claim_for_probe(held.node.id, for_s=30)
        await gate.readmit(held.node.id)
        lease = await asyncio.wait_for(after, 5)
        assert lease.node == held.node
        assert (await gate.snapshot()).busy == {held.node.id: "after"}
        await lease.release()
    finally:
        for gate in built:
            await gate.close()


async def test_no_request_fails_once_a_restarted_redis_is_back(
    key_prefix: str, own_server: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    """Every pooled connection was opened to the server before its restart: none of them
    may cost a request its turn once the new server answers."""
    server = own_server()
    built: list[RedisGate] = []
    try:
        pool = nodes(4)
        gate = replicas_on(server.url, key_prefix, built)(pool, **FAST)
        warm = await asyncio.gather(
            *(gate.acquire(priority=0, wait_s=1, holder=f"warm{i}") for i in range(4))
        )
        for lease in warm:
            await lease.release()
        # In threads: the replica's event loop runs on while Redis restarts, as it would.
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)  # same port, empty
        caplog.clear()

        waiters = [
            asyncio.create_task(gate.acquire(priority=0, wait_s=10, holder=f"after{i}"))
            for i in range(6)
        ]
        await waiting(gate, 6)  # nodes out as state_lost: the requests wait for them
        for node in pool:  # as the prober does, once it has flushed each node
            assert node.id in {n.id for n in await gate.due_for_probe()}
            assert await gate.claim_for_probe(node.id, for_s=30)
            await gate.readmit(node.id)

        async def served(waiter: asyncio.Task[RedisLease]) -> Node:
            lease = await waiter
            await lease.release()
            return lease.node

        served_by = await asyncio.wait_for(asyncio.gather(*map(served, waiters)), 10)
        assert set(served_by) == set(pool)
        assert not [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    finally:
        for gate in built:
            await gate.close()


async def test_a_password_protected_server_is_reached_with_the_secret(
    tmp_path: Path, key_prefix: str, own_server: Callable[..., RedisServer]
) -> None:
    server = own_server("--requirepass", "s3cret")
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    config = GateConfig(
        backend="redis",
        redis=RedisGateConfig(url=server.url, key_prefix=key_prefix, password_file=str(secret)),
        max_queue=4,
    )
    gate = make_gate(config, nodes(1))
    try:
        lease = await gate.acquire(priority=0, wait_s=1, holder="a")
        await lease.release()
    finally:
        await gate.close()


async def test_more_concurrent_waiters_than_connections_all_queue(replica: Replica) -> None:
    """Hundreds of requests waiting on one replica at once share a bounded set of Redis
    connections: none is refused as `gate_unavailable` while Redis is up (however slow a
    loaded host is to open them)."""
    gate = replica(nodes(1), max_queue=400, socket_timeout_s=10.0)
    held = await gate.acquire(priority=0, wait_s=1, holder="blocker")
    tasks = [
        asyncio.create_task(gate.acquire(priority=0, wait_s=30, holder=f"w{i}")) for i in range(300)
    ]
    await eventually(lambda: any(t.done() for t in tasks) or len(gate._waiters) == 300)
    assert [t.exception() for t in tasks if t.done()] == []
    await waiting(gate, 300)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await held.release()
    await waiting(gate, 0)


async def test_one_replica_at_a_time_flushes_an_out_node_and_only_it_readmits(
    replica: Replica,
) -> None:
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    await a.take_out(pool[0].id, "decode_unfinished")
    assert await a.claim_for_probe(pool[0].id, for_s=30) is not None
    assert await b.claim_for_probe(pool[0].id, for_s=30) is None
    await b.readmit(pool[0].id)  # refused: a's claim stands
    assert (await b.snapshot()).out == {pool[0].id: "decode_unfinished"}
    await a.readmit(pool[0].id)
    assert (await b.snapshot()).out == {}
    assert await b.claim_for_probe(pool[0].id, for_s=30) is None  # in service: nothing to do


async def test_a_probe_claim_given_back_lets_another_replica_flush_at_once(
    replica: Replica,
) -> None:
    pool = nodes(1)
    a, b = replica(pool), replica(pool)
    await a.take_out(pool[0].id, "lease_expired")
    assert await a.claim_for_probe(pool[0].id, for_s=60) is not None
    await b.release_probe_claim(pool[0].id)  # not b's to give back
    assert await b.claim_for_probe(pool[0].id, for_s=60) is None
    await a.release_probe_claim(pool[0].id)  # a's flush could not run yet
    assert await b.claim_for_probe(pool[0].id, for_s=60) is not None
    await a.readmit(pool[0].id)  # refused: b's claim stands
    assert (await a.snapshot()).out == {pool[0].id: "lease_expired"}


async def test_a_state_lost_while_a_node_is_held_is_noticed_by_every_replica(
    key_prefix: str, own_server: Callable[..., RedisServer]
) -> None:
    """Redis restarts empty while one replica holds a node: another replica must not be
    granted that node before a prober has seen it idle; the holder learns its lease is gone."""
    server = own_server()
    built: list[RedisGate] = []
    try:
        a, b = (replicas_on(server.url, key_prefix, built)(nodes(2), **FAST) for _ in range(2))
        held = await a.acquire(priority=0, wait_s=1, holder="held")
        other = await b.acquire(priority=0, wait_s=1, holder="other")
        await other.release()
        server.stop()
        server.start()
        assert await held.renew() is False  # the lease went with the data
        with pytest.raises(GateRejected):  # nothing in service, nothing to wait for long
            await b.acquire(priority=0, wait_s=0, holder="too-soon")
        assert (await b.snapshot()).out == {n.id: "state_lost" for n in nodes(2)}
        await held.release()  # the holder finishes: a stale release, refused
        assert (await a.snapshot()).out == {n.id: "state_lost" for n in nodes(2)}
    finally:
        for gate in built:
            await gate.close()


async def test_a_partitioned_replica_stops_before_another_is_granted_its_node(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """A replica cut off from Redis (its packets vanish, nothing is refused) knows its lease
    invalid before Redis can let it expire: another replica's grant of the node comes only
    after the cut-off holder has stopped trusting its lease, and after a flush."""
    built: list[RedisGate] = []
    pool = nodes(1)
    async with PartitionableLink("127.0.0.1", redis_server.port) as link:
        try:
            cut_off = replicas_on(link.url, key_prefix, built)(pool, **FAST)
            other = replicas_on(redis_server.url, key_prefix, built)(pool, **FAST)
            held = await cut_off.acquire(priority=0, wait_s=1, holder="cut-off")
            waiter = asyncio.create_task(other.acquire(priority=0, wait_s=10, holder="other"))
            await waiting(other, 1)
            link.cut()
            invalid_at: float | None = None
            while not waiter.done():
                if invalid_at is None and not held.valid():
                    invalid_at = time.monotonic()
                out = (await other.snapshot()).out
                if out.get(pool[0].id) == "lease_expired":  # a prober's flush, then back
                    assert await other.claim_for_probe(pool[0].id, for_s=30)
                    await other.readmit(pool[0].id)
                await asyncio.sleep(0.01)  # watching two clocks, bounded by the waiter's wait
            granted_at = time.monotonic()
            lease = waiter.result()
            assert invalid_at is not None and invalid_at <= granted_at
            assert lease.node == held.node
            await lease.release()
        finally:
            for gate in built:
                await gate.close()


async def test_a_redis_that_stops_answering_refuses_calls_within_their_time_limit(
    redis_server: RedisServer, key_prefix: str
) -> None:
    """The time limit of a command is the gate's own (redis-py's socket timeout is off): a
    Redis whose answers vanish mid-command makes the call gate_unavailable, not a hang; an
    acquire sent meanwhile too, on a connection of its own."""
    built: list[RedisGate] = []
    pool = nodes(1)
    async with PartitionableLink("127.0.0.1", redis_server.port) as link:
        try:
            gate = replicas_on(link.url, key_prefix, built)(pool, **FAST)
            held = await gate.acquire(priority=0, wait_s=1, holder="held")
            link.cut()
            async with asyncio.timeout(20 * FAST["socket_timeout_s"]):  # a hang fails here
                with pytest.raises(GateRejected) as refused:
                    await gate.acquire(priority=0, wait_s=5, holder="after the cut")
                assert refused.value.reason == "gate_unavailable"
                await held.release()  # logged, not raised: the lease expires on its own
        finally:
            for gate in built:
                await gate.close()


async def test_a_node_another_replica_found_is_granted_with_its_settings(
    replica: Replica,
) -> None:
    """Discovery gave one replica a node the other has not found yet: the queue they share
    may hand it to the other, which reads the node's settings from the pool's registry."""
    listed, found = nodes(1), dataclasses.replace(nodes(2)[1], tilert="0.1.5", pool="p")
    a, b = replica(listed, pool_id="m"), replica(listed, pool_id="m")
    await a.set_nodes([*listed, found])
    first = await a.acquire(priority=0, wait_s=1, holder="first")
    second = await a.acquire(priority=0, wait_s=1, holder="second")
    assert {first.node.id, second.node.id} == {listed[0].id, found.id}
    waiter = asyncio.create_task(b.acquire(priority=0, wait_s=10, holder="b"))
    await waiting(b, 1)
    await (first if first.node.id == found.id else second).release()
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.node == found
    await lease.release()
    await (second if first.node.id == found.id else first).release()


async def test_pools_of_two_models_never_share_a_queue(replica: Replica) -> None:
    one, other = replica(nodes(1), pool_id="one"), replica(nodes(1), pool_id="other")
    held = await one.acquire(priority=0, wait_s=1, holder="held")
    waiter = asyncio.create_task(one.acquire(priority=0, wait_s=10, holder="waiter"))
    await waiting(one, 1)
    assert (await other.snapshot()).waiting == 0
    await held.release()
    await (await asyncio.wait_for(waiter, 5)).release()


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
async def test_a_deployment_no_node_of_which_answers_means_gate_unavailable(
    key_prefix: str, scheme: str
) -> None:
    built: list[RedisGate] = []
    gate = replicas_on(f"{scheme}://127.0.0.1:{free_port()}", key_prefix, built)(nodes(1), **FAST)
    try:
        with pytest.raises(GateRejected) as refused:
            await gate.acquire(priority=0, wait_s=1, holder="a")
        assert refused.value.reason == "gate_unavailable"
        assert (await gate.snapshot()).out == {nodes(1)[0].id: "gate_unavailable"}
        with pytest.raises(GateUnavailable):
            await gate.drain(nodes(1)[0].id)
    finally:
        await gate.close()


async def test_a_cluster_client_closed_under_many_callers_recovers(
    redis_cluster: LocalCluster, key_prefix: str
) -> None:
    """redis-py closes its Cluster client's connections after some errors (the cluster
    down, a slot not covered); callers sending commands meanwhile see only gate_unavailable,
    and the next requests are served."""
    built: list[RedisGate] = []
    gate = replicas_on(redis_cluster.url, key_prefix, built)(nodes(4), max_queue=400)
    try:
        await (await gate.acquire(priority=0, wait_s=1, holder="first")).release()
        await gate._redis.client.aclose()  # as redis-py does on CLUSTERDOWN

        async def request(i: int) -> str:
            try:
                lease = await gate.acquire(priority=0, wait_s=10, holder=f"r{i}")
            except GateRejected as refused:
                return refused.reason
            await lease.release()
            return "served"

        outcomes = await asyncio.gather(*(request(i) for i in range(100)))
        assert set(outcomes) <= {"served", "gate_unavailable"}
        lease = await gate.acquire(priority=0, wait_s=5, holder="after")
        await lease.release()
    finally:
        await gate.close()


async def test_a_wake_up_channel_lost_is_heard_again_long_before_the_poll(
    own_server: Callable[..., RedisServer], key_prefix: str
) -> None:
    """The server drops the replicas' subscriptions (a busy moment, a failover): each
    subscribes again at once, so a release wakes the other replica's waiter now, not at
    its poll 30 s away."""
    server = own_server()
    built: list[RedisGate] = []
    replica = replicas_on(server.url, key_prefix, built)
    pool = nodes(1)
    a, b = replica(pool), replica(pool, poll_s=30)
    held = await a.acquire(priority=0, wait_s=1, holder="held")
    remote = asyncio.create_task(b.acquire(priority=0, wait_s=20, holder="remote"))
    await waiting(a, 1)
    subscriptions = [a._waiters.subscribed, b._waiters.subscribed]
    assert all(s.is_set() for s in subscriptions)
    raw = Redis.from_url(server.url)
    try:
        assert await raw.client_kill_filter(_type="pubsub") >= 2
    finally:
        await raw.aclose()
    await eventually(lambda: not b._waiters.subscribed.is_set())
    await eventually(lambda: all(s.is_set() for s in subscriptions))
    await held.release()
    lease = await asyncio.wait_for(remote, 5)
    assert lease.holder == "remote"
    await lease.release()
    for gate in built:
        await gate.close()
