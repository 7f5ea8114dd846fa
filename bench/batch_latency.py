"""Batch relay latency on a batching pool (TileRT 0.1.6): from the moment a node handed a
line of tokens to its server to the moment the client read the chunk carrying it.

Each request's chunks are paired, in order, with the lines its node wrote (the node's
record under the request's rid: `line_writes`, wall clock, the same machine's). A gateway
gives the backends a rid of its own, so every request names itself in its `user` field,
which reaches the prefill server: its record of the prefill gives the rid the node saw
(X-Request-Id). Directly, the chunk is the node's line itself; through the gateway, the
SSE event it rendered from it. A request whose chunk count differs from its node's line
count (text held back across a line, say) cannot be paired line by line and is counted
apart, not guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.streams import Sample
from sim.stack import NodeInfo


@dataclass(slots=True)
class Relays:
    """The relay latencies of some requests (s), and how many could not be paired."""

    latencies_s: list[float] = field(default_factory=list)
    unpaired: int = 0


def paired(
    samples: Sequence[Sample], rids: dict[str, str], lines: dict[str, list[float]]
) -> Relays:
    """Each sample's chunk arrivals minus its node's line writes; `rids`: the node's rid by
    the name the sample went by, `lines`: write times by node rid."""
    found = Relays()
    for sample in samples:
        writes = lines.get(rids.get(sample.rid, ""))
        if writes is None or len(writes) != len(sample.arrivals):
            found.unpaired += 1
            continue
        found.latencies_s += [
            got - wrote for got, wrote in zip(sample.arrivals, writes, strict=True)
        ]
    return found


async def node_rids(client: httpx.AsyncClient, prefill_urls: Sequence[str]) -> dict[str, str]:
    """The rid each named request went to its node with, by its name, from the prefill
    servers' records."""
    found: dict[str, str] = {}
    for url in prefill_urls:
        reply = await client.get(url + "/sim/requests")
        for record in reply.raise_for_status().json()["requests"]:
            name = (record.get("body") or {}).get("user")
            if isinstance(name, str):
                found[name] = record["headers"].get("x-request-id", "")
    return found


async def line_writes(
    client: httpx.AsyncClient, nodes: Sequence[NodeInfo]
) -> dict[str, list[float]]:
    """Every recorded decode's line write times on `nodes`, by rid."""
    found: dict[str, list[float]] = {}
    for node in nodes:
        reply = await client.get(node.url + "/sim/records")
        decodes: list[dict[str, Any]] = reply.raise_for_status().json()["decodes"]
        found |= {record["rid"]: record["line_writes"] for record in decodes}
    return found


async def forget(
    client: httpx.AsyncClient, prefill_urls: Sequence[str], nodes: Sequence[NodeInfo]
) -> None:
    """Clear the records of the prefill servers and of idle `nodes`, so that a round's
    reading is its own."""
    for url in [*prefill_urls, *(node.url for node in nodes)]:
        (await client.post(url + "/sim/reset")).raise_for_status()
