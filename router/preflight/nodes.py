"""Each TileRT node's release and features, against its pool's release."""

from __future__ import annotations

import asyncio
import sys

from router.config import GatewayConfig
from router.node import Node
from router.upstream import Upstreams, tilert


async def probe_nodes(config: GatewayConfig, upstreams: Upstreams) -> int:
    """One line per node; 1 if a node cannot be reached or runs another release than its
    pool."""
    failed = 0
    for model in config.models:
        for pool in model.latency.pools if model.latency is not None else []:
            nodes = [Node.of_pool(pool, node) for node in pool.nodes]
            found = await asyncio.gather(*(tilert.node_facts(upstreams, n) for n in nodes))
            for node, facts in zip(nodes, found, strict=True):
                where = f"node {node.id} (model {model.name}, pool {pool.name})"
                if facts is None:
                    print(f"error: {where}: cannot reach {node.url}", file=sys.stderr)
                    failed = 1
                elif facts.version != pool.tilert:
                    print(
                        f"error: {where}: runs TileRT {facts.version}, its pool is {pool.tilert}",
                        file=sys.stderr,
                    )
                    failed = 1
                else:
                    features = ", ".join(sorted(facts.features)) or "none"
                    print(f"{where}: TileRT {facts.version}, features: {features}")
    return failed
