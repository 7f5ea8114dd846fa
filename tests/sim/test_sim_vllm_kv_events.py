"""KV-cache events of the simulated vLLM server (--kv-events-config) on a real ZMQ socket."""

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq
import zmq.asyncio

from sim.stack import ServerInfo, SimStack
from sim.vllm.kv_events import external_hash
from sim.vllm.prefix_cache import block_hashes
from tests.support.stacks import StackPool

pytestmark = pytest.mark.e2e

TOPIC = b"kv"
EVENTS = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:*"}
ARGS = [
    "--itl-ms",
    "0",
    "--prefill-ms-per-token",
    "0",
    "--block-size",
    "4",
    "--enable-prefix-caching",
]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    config = json.dumps({**EVENTS, "topic": TOPIC.decode()})
    args = [*ARGS, "--num-gpu-blocks", "16", "--kv-events-config", config]
    return sim_stacks.get(nodes=0, prefills=0, proxy=True, proxy_args=args)


@pytest.fixture
def server(stack: SimStack) -> ServerInfo:
    assert stack.proxy is not None
    return stack.proxy


class Subscriber:
    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.socket = socket
        self.last_seq: int | None = None

    async def batch(self) -> list[dict[str, Any]]:
        """The next batch's events (sequence numbers checked to follow each other)."""
        assert await self.socket.poll(10_000), "no KV event batch in time"
        topic, seq_bytes, payload = await self.socket.recv_multipart()
        assert topic == TOPIC
        seq = int.from_bytes(seq_bytes, "big")
        if self.last_seq is not None:
            assert seq == self.last_seq + 1
        self.last_seq = seq
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank is None
        return events


async def _complete(client: httpx.AsyncClient, server: ServerInfo, prompt: list[int]) -> None:
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
    assert (await client.post(f"{server.url}/v1/completions", json=body)).status_code == 200


@pytest.fixture
async def events(client: httpx.AsyncClient, server: ServerInfo) -> AsyncIterator[Subscriber]:
    """A subscriber that has seen the cache emptied: the next batch is the test's own."""
    assert server.kv_events_endpoint is not None
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, TOPIC)
    socket.connect(server.kv_events_endpoint)
    subscriber = Subscriber(socket)
    try:
        # A subscription takes effect some time after connecting: publish until one arrives.
        probe = 9000
        while not await socket.poll(100):
            probe += 1
            await _complete(client, server, [probe, 1, 2, 3, 4])
        await client.post(f"{server.url}/sim/reset")
        while {"type": "AllBlocksCleared"} not in await subscriber.batch():
            pass
        yield subscriber
    finally:
        socket.close(linger=0)
        context.term()


def _stored(tokens: list[int], parent: bytes | None, hashes: list[bytes]) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": [external_hash(h) for h in hashes],
        "parent_block_hash": None if parent is None else external_hash(parent),
        "token_ids": tokens,
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }


async def test_stored_blocks_chain_from_the_cached_prefix(
    client: httpx.AsyncClient, server: ServerInfo, events: Subscriber
) -> None:
    first = list(range(5000, 5010))  # two full blocks and a partial one
    await _complete(client, server, first)
    first_hashes = block_hashes(first, 4)
    assert await events.batch() == [_stored(first[:8], None, first_hashes)]

    second = [*first[:8], 1, 2, 3, 4, 9]  # shares the two blocks, adds one
    await _complete(client, server, second)
    second_hashes = block_hashes(second, 4)
    assert second_hashes[:2] == first_hashes
    assert await events.batch() == [_stored([1, 2, 3, 4], first_hashes[1], second_hashes[2:])]

    await client.post(f"{server.url}/sim/reset")
    assert await events.batch() == [{"type": "AllBlocksCleared"}]


async def test_evicted_blocks_are_removed_oldest_first(
    client: httpx.AsyncClient, server: ServerInfo, events: Subscriber
) -> None:
    filling = list(range(6000, 6064))  # 16 blocks: the whole cache
    await _complete(client, server, filling)
    assert len((await events.batch())[0]["block_hashes"]) == 16
    newcomer = list(range(7000, 7008))
    await _complete(client, server, newcomer)
    oldest = block_hashes(filling, 4)[:2]
    assert await events.batch() == [
        _stored(newcomer, None, block_hashes(newcomer, 4)),
        *(
            {
                "type": "BlockRemoved",
                "block_hashes": [external_hash(h)],
                "medium": "GPU",
                "group_idx": 0,
            }
            for h in oldest
        ),
    ]
