"""What replicas share, in its own versioned format: read across versions by its rule
(unknown fields ignored, an unknown version refused, logged and counted), and two replicas
of different format versions on one real Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from router.config import GateConfig, RedisGateConfig
from router.gate import GateRejected, make_gate
from router.gate.redis import RedisGate
from router.gate.redis.records import RecordUnreadable, decode_node, encode_node
from router.node import Node
from router.telemetry.metrics import Metrics
from tests.gate.conftest import nodes, waiting
from tests.gate.redis_server import RedisServer

FOUND = Node(host="10.0.0.7", ctrl_port=5556, http_port=5557, tilert="0.1.5", pool="p")


def test_a_node_record_is_read_back_as_the_node_it_was() -> None:
    named = dataclasses.replace(FOUND, name="decode-7")
    for node in (FOUND, named, nodes(1)[0]):
        assert decode_node(encode_node(node)) == node
    assert json.loads(encode_node(FOUND))["v"] == 1


def test_fields_a_reader_does_not_know_are_ignored() -> None:
    record = json.loads(encode_node(FOUND)) | {"weight": 3, "zone": {"rack": 2}}
    assert decode_node(json.dumps(record)) == FOUND


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (json.dumps(json.loads(encode_node(FOUND)) | {"v": 2}), "version"),
        (
            json.dumps({k: v for k, v in json.loads(encode_node(FOUND)).items() if k != "v"}),
            "version",
        ),
        ('{"v": 1, "id": "h:1"}', "malformed"),  # no host, no ports
        (json.dumps(json.loads(encode_node(FOUND)) | {"http_port": "x"}), "malformed"),
        (json.dumps(json.loads(encode_node(FOUND)) | {"id": "another"}), "malformed"),
        ("[1, 2]", "malformed"),
        ("{not json", "malformed"),
    ],
)
def test_a_record_this_release_cannot_read_is_refused(raw: str, reason: str) -> None:
    with pytest.raises(RecordUnreadable) as refused:
        decode_node(raw)
    assert refused.value.reason == reason


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    async with Redis.from_url(redis_server.url, decode_responses=True) as client:
        yield client


def replica(url: str, prefix: str, node_list: list[Node], metrics: Metrics) -> RedisGate:
    config = GateConfig(backend="redis", redis=RedisGateConfig(url=url, key_prefix=prefix))
    gate = make_gate(config, node_list, metrics.gate, pool_id="m")
    assert isinstance(gate, RedisGate)
    return gate


def unreadable(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "pd_gateway_gate_shared_records_unreadable_total", {"reason": "version"}
    )


@pytest.mark.e2e
@pytest.mark.parametrize("newer_version", [1, 2])
async def test_replicas_of_two_format_versions_share_one_redis(
    redis_server: RedisServer, redis_client: Redis, key_prefix: str, newer_version: int
) -> None:
    """Replica `newer` runs a later release than `older`: it shares the node it found in
    its own format, a version 1 record with a field `older` does not know, or a version 2
    record. `older` is granted that node through the queue they share: it reads the first;
    it refuses the second (logged, counted, the node passed on and not lost), and the rest
    of the pool keeps serving it."""
    listed = nodes(1)
    older_metrics = Metrics()
    older = replica(redis_server.url, key_prefix, listed, older_metrics)
    newer = replica(redis_server.url, key_prefix, listed, Metrics())
    try:
        await newer.set_nodes([*listed, FOUND])
        first = await newer.acquire(priority=0, wait_s=1, holder="first")
        second = await newer.acquire(priority=0, wait_s=1, holder="second")
        found, other = (first, second) if first.node == FOUND else (second, first)
        record = json.loads(encode_node(FOUND)) | {"v": newer_version, "drain_grace_s": 5}
        await redis_client.hset(newer.keys.nodes, FOUND.id, json.dumps(record))  # its format
        waiter = asyncio.create_task(older.acquire(priority=0, wait_s=10, holder="older"))
        await waiting(older, 1)
        await found.release()  # to `older`'s waiter, the head of the shared queue
        if newer_version == 1:
            lease = await asyncio.wait_for(waiter, 5)
            assert lease.node == FOUND
            assert not unreadable(older_metrics)
            await lease.release()
        else:
            with pytest.raises(GateRejected) as refused:
                await asyncio.wait_for(waiter, 5)
            assert refused.value.reason == "no_node"
            assert unreadable(older_metrics) == 1
            again = await newer.acquire(priority=0, wait_s=1, holder="again")  # not leaked
            assert again.node == FOUND
            await again.release()
        await other.release()
        lease = await older.acquire(priority=0, wait_s=1, holder="listed")  # still served
        assert lease.node == listed[0]
        await lease.release()
    finally:
        await older.close()
        await newer.close()
