"""Probes the nodes the gate took out of service and lets each back in once it answers
`/health` and reports itself idle (so its own lock is free again)."""

from __future__ import annotations

import asyncio
import logging

import httpx

from router.config import NodeConfig
from router.gate.base import Gate

log = logging.getLogger("pd_gateway.health")


async def node_is_ready(http: httpx.AsyncClient, node: NodeConfig, *, timeout_s: float) -> bool:
    try:
        health = await http.get(node.url + "/health", timeout=timeout_s)
        status = await http.get(node.url + "/decode_status", timeout=timeout_s)
        return (
            health.status_code == 200
            and status.status_code == 200
            and status.json().get("status") == "idle"
        )
    except (httpx.HTTPError, ValueError):
        return False


async def probe_forever(
    gate: Gate, http: httpx.AsyncClient, *, interval_s: float, timeout_s: float
) -> None:
    """Run until cancelled: every interval, probe the nodes that are due."""
    while True:
        await asyncio.sleep(interval_s)
        for node in gate.due_for_probe():
            if await node_is_ready(http, node, timeout_s=timeout_s):
                log.info("node %s is back in service", node.id)
                gate.readmit(node.id)
