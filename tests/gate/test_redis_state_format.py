"""The version of the scripts' stored state (router/gate/redis/state_format.py), on one real
Redis server and on a Cluster: the deployment's format key marks the newest version
written; a release that does not read it refuses every call, touching nothing, with an
error logged and counted; and one version step is read across by the releases on each
side of it (the next releases are this one with the constants they would ship)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import pytest

from router.config import GateConfig, RedisGateConfig
from router.gate import GateRejected, make_gate
from router.gate.redis import RedisGate, state_format
from router.gate.redis.client import RedisClient, connect
from router.gate.redis.scripts import load_sources
from router.node import Node
from router.telemetry.metrics import Metrics
from tests.gate.conftest import DEPLOYMENTS, SUITE_SOCKET_TIMEOUT_S, nodes

pytestmark = pytest.mark.e2e  # every test here runs a redis-server

Release = Callable[..., RedisGate]


@pytest.fixture(params=DEPLOYMENTS)
def redis_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param).url)


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[RedisClient]:
    client = connect(RedisGateConfig(url=redis_url), None, max_connections=4)
    yield await client.settled()
    await client.aclose()


@pytest.fixture
async def release(
    redis_url: str, key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Release]:
    """`release(node_list, metrics, reads={1}, writes=1)`: a replica of a release that reads
    and writes those versions of the state, on the test's deployment."""
    built: list[RedisGate] = []

    def build(
        node_list: list[Node],
        metrics: Metrics | None = None,
        *,
        reads: frozenset[int] = state_format.READS,
        writes: int = state_format.WRITES,
    ) -> RedisGate:
        redis = RedisGateConfig(
            url=redis_url, key_prefix=key_prefix, socket_timeout_s=SUITE_SOCKET_TIMEOUT_S
        )
        with monkeypatch.context() as patched:  # the scripts are built with the constants
            patched.setattr(state_format, "READS", reads)
            patched.setattr(state_format, "WRITES", writes)
            gate = make_gate(
                GateConfig(backend="redis", redis=redis),
                node_list,
                (metrics or Metrics()).gate,
                pool_id="m",
            )
        assert isinstance(gate, RedisGate)
        built.append(gate)
        return gate

    yield build
    for gate in built:
        await gate.close()


def refusals(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value(
        "pd_gateway_gate_shared_records_unreadable_total", {"reason": "state_version"}
    )
    return value or 0.0


async def served(gate: RedisGate) -> bool:
    """Whether `gate` is granted a node (given back at once), or refused as unavailable."""
    try:
        lease = await gate.acquire(priority=0, wait_s=1, holder="probe")
    except GateRejected as refused:
        assert refused.reason == "gate_unavailable"
        return False
    await lease.release()
    return True


def test_every_script_is_told_the_versions_this_release_reads_and_writes() -> None:
    for source, _ in load_sources().values():
        assert 'local STATE_WRITES = 1\nlocal STATE_READS = {["1"] = true}\n' in source


async def test_a_deployments_first_call_marks_its_state_with_this_releases_version(
    release: Release, redis_client: RedisClient
) -> None:
    gate = release(nodes(1))
    assert await redis_client.get(gate.keys.format) is None
    assert await served(gate)
    assert await redis_client.get(gate.keys.format) == "1"


async def test_a_state_of_a_version_this_release_does_not_read_is_refused_untouched(
    release: Release, redis_client: RedisClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call refuses before it writes anything: no queue, no lease, no epoch, no
    heartbeat; logged as an error and counted. Marked back, the state serves again."""
    metrics = Metrics()
    gate = release(nodes(2), metrics)
    await redis_client.set(gate.keys.format, "2")  # written by a later release
    with caplog.at_level(logging.ERROR, logger="pd_gateway.gate"):
        assert not await served(gate)
        snapshot = await gate.snapshot()
    assert snapshot.out == {n.id: "gate_unavailable" for n in nodes(2)}
    assert refusals(metrics) >= 2  # the acquire, the snapshot's state
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("format version '2'; this release reads [1]" in e for e in errors), errors
    pool = gate.pool_keys
    untouched = [pool.queue, pool.wait, pool.epoch, pool.grants, pool.alive]
    for node in nodes(2):
        untouched += gate.keys.node(node.id)
    assert await redis_client.exists(*untouched) == 0
    assert await redis_client.get(gate.keys.format) == "2"

    await redis_client.set(gate.keys.format, "1")
    assert await served(gate)


async def test_one_version_step_is_read_across_and_a_release_behind_it_refuses(
    release: Release, redis_client: RedisClient
) -> None:
    """This release reads version 1 alone. The next introduces version 2 (reads 1 and 2,
    writes 1): both serve side by side, and the state stays version 1. The one after it
    writes 2: beside the one before it, both serve and the state is marked 2 for good (a
    replica writing 1 never lowers it); this release, two steps behind, refuses."""
    this = release(nodes(1))
    reads_next = release(nodes(1), reads=frozenset({1, 2}), writes=1)
    assert await served(this)
    assert await served(reads_next)
    assert await served(this)
    assert await redis_client.get(this.keys.format) == "1"

    writes_next = release(nodes(1), reads=frozenset({1, 2}), writes=2)
    assert await served(writes_next)
    assert await redis_client.get(this.keys.format) == "2"
    assert await served(reads_next)
    assert await redis_client.get(this.keys.format) == "2"
    assert not await served(this)
    assert await served(writes_next)
