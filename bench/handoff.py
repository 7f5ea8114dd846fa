"""The slot hand-off: how long a freed TileRT node waits for its next prefill while clients
queue for the pool.

The gap of a node is read from the simulators' own records: from the end of one decode's
response on the node to the arrival at the prefill server of the next prefill naming that
node. Whatever a router does in between (release, the next grant, the waiter's wake-up, its
prefill call) is in it, and so is the prefill server's own handling of the request up to
its record. Without a gateway ("direct"), the clients run the latency flow themselves and
a node goes to the longest-waiting client the moment its decode response ends: what the
clients would manage on their own, in the load generator's process, beside its other
streams.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import httpx

from sim.stack import NodeInfo, SimStack

Address = tuple[str, int]  # a node's (tilert_host, tilert_ctrl_port)
T = TypeVar("T")


class NodeQueue:
    """Free nodes handed to waiting clients in the order they asked, as a gate does: a
    client takes one, runs its request on it, and gives it up the moment the request has
    ended, to the longest waiter if there is one. (An asyncio.Queue would let the client
    that just gave a node back take it again at once, ahead of every waiter.)"""

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        self._free = deque(nodes)
        self._waiters: deque[asyncio.Future[NodeInfo]] = deque()

    async def run(self, request: Callable[[NodeInfo], Awaitable[T]]) -> tuple[T, float]:
        """`request(node)` on a free node, and how long it waited for one (s)."""
        asked = time.perf_counter()
        node = await self._take()
        waited = time.perf_counter() - asked
        try:
            return await request(node), waited
        finally:
            self._give_back(node)

    async def _take(self) -> NodeInfo:
        if self._free and not self._waiters:
            return self._free.popleft()
        waiter: asyncio.Future[NodeInfo] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_back(waiter.result())  # handed over as it was cancelled
            else:
                self._waiters.remove(waiter)
            raise

    def _give_back(self, node: NodeInfo) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(node)
                return
        self._free.append(node)


def gaps(
    prefills: Iterable[dict[str, Any]], decodes: dict[Address, list[dict[str, Any]]]
) -> list[float]:
    """Per node, each ended decode to the first prefill naming the node after it, in seconds:
    `prefills` are the prefill servers' request records, `decodes` each node's decode records
    (wall-clock times, the same machine's; a stream ends at its last write)."""
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
            # A stream's end is when its last bytes were written: `end` is noted after the
            # write, and a node preempted in between would note it after the next prefill.
            ended = record.get("last_write") or record["end"]
            if ended is None:
                continue
            index = bisect.bisect_right(later, ended)
            if index < len(later):
                found.append(later[index] - ended)
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
