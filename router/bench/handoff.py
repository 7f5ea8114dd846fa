"""The slot hand-off: how long a freed TileRT node waits for its next prefill while clients
queue for the pool.

The gap of a node is read from the simulators' own records: from the end of one decode's
response on the node to the arrival at the prefill server of the next prefill naming that
node. Whatever a relay does in between (release, the next grant, the waiter's wake-up, its
prefill call) is in it. Without a gateway, clients pass a node to each other through an
asyncio queue the moment its decode response ends: the floor the simulators and the
machine allow.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import httpx

from sim.stack import NodeInfo, SimStack

Address = tuple[str, int]  # a node's (tilert_host, tilert_ctrl_port)
T = TypeVar("T")


class NodeQueue:
    """Free nodes in an asyncio queue: a client takes one, runs its request on it and puts
    it back as soon as the request has ended, so a waiting client gets it at once."""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self._nodes = nodes
        self._free: asyncio.Queue[NodeInfo] | None = None  # made in the running loop

    async def run(self, request: Callable[[NodeInfo], Awaitable[T]]) -> tuple[T, float]:
        """`request(node)` on a free node, and how long it waited for one (s)."""
        if self._free is None:
            self._free = asyncio.Queue()
            for node in self._nodes:
                self._free.put_nowait(node)
        asked = time.perf_counter()
        node = await self._free.get()
        waited = time.perf_counter() - asked
        try:
            return await request(node), waited
        finally:
            self._free.put_nowait(node)


def gaps(
    prefills: Iterable[dict[str, Any]], decodes: dict[Address, list[dict[str, Any]]]
) -> list[float]:
    """Per node, each ended decode to the first prefill naming the node after it, in seconds:
    `prefills` are the prefill servers' request records, `decodes` each node's decode records
    (wall-clock times, the same machine's)."""
    arrivals: dict[Address, list[float]] = defaultdict(list)
    for record in prefills:
        params = (record.get("body") or {}).get("kv_transfer_params") or {}
        if "tilert_host" in params:
            address = (params["tilert_host"], params["tilert_ctrl_port"])
            arrivals[address].append(record["received"])
    found = []
    for address, records in decodes.items():
        later = sorted(arrivals[address])
        for record in records:
            if record["end"] is None:
                continue
            index = bisect.bisect_right(later, record["end"])
            if index < len(later):
                found.append(later[index] - record["end"])
    return found


async def forget(client: httpx.AsyncClient, stack: SimStack, nodes: Sequence[NodeInfo]) -> None:
    """Clear the records of the prefill servers and of idle `nodes`: the next `measured`
    reads one round's alone."""
    for url in [server.url for server in stack.prefills] + [node.url for node in nodes]:
        (await client.post(url + "/sim/reset")).raise_for_status()


async def measured(
    client: httpx.AsyncClient, stack: SimStack, nodes: Sequence[NodeInfo]
) -> list[float]:
    """The hand-off gaps of `nodes` since the last `forget`, in seconds."""
    prefills: list[dict[str, Any]] = []
    for server in stack.prefills:
        reply = await client.get(server.url + "/sim/requests")
        prefills += reply.raise_for_status().json()["requests"]
    decodes = {}
    for node in nodes:
        reply = await client.get(node.url + "/sim/records")
        decodes[(node.host, node.ctrl_port)] = reply.raise_for_status().json()["decodes"]
    return gaps(prefills, decodes)
