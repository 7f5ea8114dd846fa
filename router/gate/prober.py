"""Probes the nodes the gate took out of service and lets each back in once it answers
`/health` and reports itself idle (so its own lock is free again)."""

from __future__ import annotations

import asyncio
import logging

from router.gate.base import PoolAdmin
from router.upstream import Upstreams, tilert

log = logging.getLogger("pd_gateway.health")


async def probe_forever(pool: PoolAdmin, upstreams: Upstreams, *, interval_s: float) -> None:
    """Run until cancelled: every interval, probe the nodes that are due."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            due = await pool.due_for_probe()
            ready = await asyncio.gather(*(tilert.is_ready(upstreams, node) for node in due))
            for node, ok in zip(due, ready, strict=True):
                if ok:
                    log.info("node %s is back in service", node.id)
                    await pool.readmit(node.id)
        except Exception:  # nothing may end the prober: out nodes would never come back
            log.exception("probing the nodes out of service failed")


async def admit_ready_nodes(pool: PoolAdmin, upstreams: Upstreams) -> None:
    """At start-up: a node that is down or still decoding (a previous gateway's request)
    starts out of service, until the prober finds it ready."""
    nodes = await pool.nodes()
    ready = await asyncio.gather(*(tilert.is_ready(upstreams, node) for node in nodes))
    for node, ok in zip(nodes, ready, strict=True):
        if not ok:
            log.warning("node %s is not ready at start-up: out of service until it is", node.id)
            await pool.take_out(node.id, "not_ready_at_start")
