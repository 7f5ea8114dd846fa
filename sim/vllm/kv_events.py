"""KV-cache events as vLLM publishes them with ``--kv-events-config``: ZMQ PUB.

Each message is three frames: the topic, an 8-byte big-endian sequence number, and a
msgpack ``KVEventBatch``: the array ``[ts, events, data_parallel_rank]`` whose events are
maps tagged by ``type`` — ``BlockStored`` (one per run of newly cached consecutive
blocks), ``BlockRemoved`` (one per evicted block), ``AllBlocksCleared``. Block hashes
are sent as vLLM sends them by default: the first 8 bytes of the hash as an integer
(the low 64 bits of the big-endian value). ``pyzmq`` and ``msgpack`` are imported only
when events are on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sim.vllm.prefix_cache import Admission

MEDIUM = "GPU"


def external_hash(block_hash: bytes) -> int:
    """A block hash as vLLM's events carry it (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``)."""
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)


def admission_events(
    token_ids: Sequence[int], block_size: int, admission: Admission
) -> list[dict[str, Any]]:
    """The events of one prompt's caching: stored runs, then evictions."""
    events: list[dict[str, Any]] = []
    stored = set(admission.stored)
    run: list[int] = []  # indexes of the current run of newly stored blocks

    def flush() -> None:
        if not run:
            return
        first = run[0]
        parent = admission.hashes[first - 1] if first else None
        events.append(
            {
                "type": "BlockStored",
                "block_hashes": [external_hash(admission.hashes[i]) for i in run],
                "parent_block_hash": None if parent is None else external_hash(parent),
                "token_ids": list(token_ids[first * block_size : (run[-1] + 1) * block_size]),
                "block_size": block_size,
                "lora_id": None,
                "medium": MEDIUM,
                "lora_name": None,
                "group_idx": 0,
            }
        )
        run.clear()

    for index, block_hash in enumerate(admission.hashes):
        if block_hash in stored:
            run.append(index)
        else:
            flush()
    flush()
    for block_hash in admission.evicted:
        events.append(
            {
                "type": "BlockRemoved",
                "block_hashes": [external_hash(block_hash)],
                "medium": MEDIUM,
                "group_idx": 0,
            }
        )
    return events


def all_cleared() -> list[dict[str, Any]]:
    """The event of an emptied cache."""
    return [{"type": "AllBlocksCleared"}]


class KvEventPublisher:
    """A ZMQ PUB socket bound to ``endpoint`` sending batches under ``topic``."""

    def __init__(self, endpoint: str, topic: str = "") -> None:
        import zmq

        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.bind(endpoint)
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._seq = 0

    def publish(self, events: list[dict[str, Any]]) -> None:
        """Send one batch (nothing when there are no events); never blocks."""
        import msgpack

        if not events:
            return
        payload = msgpack.packb([time.time(), events, None])
        frames = [self._topic, self._seq.to_bytes(8, "big"), payload]
        try:
            self._socket.send_multipart(frames, flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass  # no room: dropped, as a PUB socket drops at its high-water mark
        self._seq += 1
