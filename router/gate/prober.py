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
        body = status.json()
    except (httpx.HTTPError, ValueError):
        return False
    return (
        health.status_code == 200
        and status.status_code == 200
        and isinstance(body, dict)
        and body.get("status") == "idle"
    )


async def probe_forever(
    gate: Gate, http: httpx.AsyncClient, *, interval_s: float, timeout_s: float
) -> None:
    """Run until cancelled: every interval, probe the nodes that are due."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            due = gate.due_for_probe()
            ready = await asyncio.gather(
                *(node_is_ready(http, node, timeout_s=timeout_s) for node in due)
            )
            for node, ok in zip(due, ready, strict=True):
                if ok:
                    log.info("node %s is back in service", node.id)
                    gate.readmit(node.id)
        except Exception:  # nothing may end the prober: out nodes would never come back
            log.exception("probing the nodes out of service failed")


async def admit_ready_nodes(gate: Gate, http: httpx.AsyncClient, *, timeout_s: float) -> None:
    """At start-up: a node that is down or still decoding (a previous gateway's request)
    starts out of service, until the prober finds it ready."""
    nodes = gate.snapshot().busy
    configs = {n.id: n for n in gate.nodes()}
    ready = await asyncio.gather(
        *(node_is_ready(http, configs[node_id], timeout_s=timeout_s) for node_id in nodes)
    )
    for node_id, ok in zip(nodes, ready, strict=True):
        if not ok:
            log.warning("node %s is not ready at start-up: out of service until it is", node_id)
            gate.take_out(node_id, "not_ready_at_start")
