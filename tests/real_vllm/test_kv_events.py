"""vLLM's own KV-cache events, re-hashed by the gateway's exact prefix index, give the chain
`block_hashes` computes from the prompt's token ids: the index matches what vLLM holds for
the block size configured."""

from __future__ import annotations

import time
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from router.selection.affinity import block_hashes
from router.selection.kv_events import ServerBlocks
from tests.real_vllm.conftest import BLOCK, KV_EVENTS_TOPIC, ConnectorVllm
from tests.real_vllm.server import VllmServer


@pytest.fixture(scope="module")
def server_and_events(connector_vllm: ConnectorVllm) -> tuple[VllmServer, int]:
    """A vLLM server caching prefixes in `BLOCK`-token blocks and publishing its events."""
    return connector_vllm.server, connector_vllm.events_port


def complete(server: VllmServer, prompt: str) -> list[int]:
    """The prompt's token ids, as vLLM reports them."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": 1, "return_token_ids": True}
    reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    ids: list[int] = reply.json()["choices"][0]["prompt_token_ids"]
    return ids


def batches(socket: zmq.Socket[bytes], seen: list[dict[str, Any]]) -> None:
    """Every batch waiting on `socket`, its events added to `seen` in order."""
    while socket.poll(0):
        topic, seq, payload = socket.recv_multipart()
        assert topic == KV_EVENTS_TOPIC.encode() and len(seq) == 8
        _ts, events, *_ = msgpack.unpackb(payload)
        seen += events


def test_stored_blocks_rehashed_are_the_prompts_block_hashes(
    server_and_events: tuple[VllmServer, int],
) -> None:
    server, port = server_and_events
    context = zmq.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, KV_EVENTS_TOPIC.encode())
    socket.connect(f"tcp://127.0.0.1:{port}")
    try:
        seen: list[dict[str, Any]] = []
        # A subscription takes effect some time after connecting: prompt until one arrives.
        warmup = 0
        while not socket.poll(500):
            warmup += 1
            complete(server, f"warm up number {warmup} " * 8)
        batches(socket, seen)

        prompt = " ".join(f"alpha{i} beta{i * 7} gamma{i * 13}" for i in range(30))
        ids = complete(server, prompt)
        full = len(ids) // BLOCK
        assert full >= 4, ids
        deadline = time.monotonic() + 30
        index = ServerBlocks(BLOCK)
        while index.matched(block_hashes(ids, BLOCK)) < full:
            assert time.monotonic() < deadline, f"events seen: {seen}"
            socket.poll(500)
            batches(socket, seen)
            index = ServerBlocks(BLOCK)
            index.apply_now(seen)

        stored = [e for e in seen if e["type"] == "BlockStored"]
        assert all(e["block_size"] == BLOCK for e in stored)
        ours = [e for e in stored if e["token_ids"] == ids[: len(e["token_ids"])]]
        assert ours and ours[0]["parent_block_hash"] is None
        assert index.ignored == {}
        # Every block of the prompt, and nothing more of it (the partial block is not held).
        assert index.matched(block_hashes([*ids, *ids[-BLOCK:]], BLOCK)) == full
    finally:
        socket.close(linger=0)
        context.term()
