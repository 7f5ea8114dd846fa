"""Keeps each node's service state true to the node: learns its TileRT release and features,
takes out a node whose release contradicts its pool, and lets a node that was out back in
only after flushing it (it may hold an orphaned transfer) and finding it healthy and idle.
"""

from __future__ import annotations

import asyncio
import logging
import time

from router.gate.base import PoolAdmin
from router.node import Node
from router.node_lifecycle.facts import NodeFactsBook
from router.node_lifecycle.repeats import RepeatedLines
from router.telemetry.metrics import Metrics
from router.upstream import Upstreams, tilert

log = logging.getLogger("pd_gateway.health")

FLUSH_CLAIM_S = 60.0
"""How long a prober keeps a node to itself to flush it: more than a flush can take. The
claim is given back early when the flush could not run."""

MISMATCH_LINES = RepeatedLines(every_s=300.0)
"""A node of the wrong release is found at every probe: logged once, then every 5 minutes
with the count, or at once when what it runs changes."""


async def probe_pool_forever(
    pool: PoolAdmin,
    upstreams: Upstreams,
    facts: NodeFactsBook,
    metrics: Metrics,
    *,
    model: str,
    interval_s: float,
    facts_every_s: float,
) -> None:
    """Run until cancelled: every interval, probe the nodes out of service that are due;
    every `facts_every_s`, ask every node for its facts again. `model`: the pool's, for the
    metrics."""
    facts_due = time.monotonic() + facts_every_s
    while True:
        await asyncio.sleep(interval_s)
        try:
            if time.monotonic() >= facts_due:
                facts_due = time.monotonic() + facts_every_s
                nodes = await pool.nodes()
                await asyncio.gather(*(learn(pool, upstreams, facts, n) for n in nodes))
            due = await pool.due_for_probe()
            await asyncio.gather(
                *(_probe_out_node(pool, upstreams, facts, metrics, model, n) for n in due)
            )
        except Exception:  # nothing may end the prober: out nodes would never come back
            log.exception("probing the nodes failed")


async def learn(pool: PoolAdmin, upstreams: Upstreams, facts: NodeFactsBook, node: Node) -> bool:
    """Ask the node for its release and features; False (and the node taken out) if its
    release is not its pool's. An unreachable node keeps what was known of it."""
    found = await tilert.node_facts(upstreams, node)
    if found is None:
        return True
    if node.tilert is not None and found.version != node.tilert:
        facts.forget(node.id)
        reason = f"tilert_version_mismatch: node runs {found.version}, pool is {node.tilert}"
        repeats = MISMATCH_LINES.due(node.id, reason)
        if repeats == 0:
            log.error("node %s: %s; out of service once free", node.id, reason)
        elif repeats is not None:
            log.error("node %s: still %s (%d probes since last said)", node.id, reason, repeats)
        await pool.retire(node.id, reason)
        return False
    MISMATCH_LINES.clear(node.id)
    facts.learn(node.id, found)
    return True


async def _probe_out_node(
    pool: PoolAdmin,
    upstreams: Upstreams,
    facts: NodeFactsBook,
    metrics: Metrics,
    model: str,
    node: Node,
) -> None:
    if not await learn(pool, upstreams, facts, node):
        return
    claim = await pool.claim_for_probe(
        node.id, for_s=FLUSH_CLAIM_S, quiet_s=_stale_transfer_quiet_s(upstreams, facts, node)
    )
    if claim is None:
        return
    if claim.stale_rid is not None:
        await _cancel_orphaned_decode(upstreams, metrics, model, node, claim.stale_rid)
    outcome = await flushed_and_ready(upstreams, metrics, node, rid=claim.stale_rid)
    if outcome == "clean":
        log.info("node %s is back in service", node.id)
        await pool.readmit(node.id)
    elif outcome == "not_run":
        # Nothing of this flush can reach the node any more: the next probe round (of any
        # replica) tries again, rather than after the claim's whole lifetime.
        await pool.release_probe_claim(node.id)


async def _cancel_orphaned_decode(
    upstreams: Upstreams, metrics: Metrics, model: str, node: Node, rid: str
) -> None:
    """The decode of a request whose lease expired, if the node still runs it, is cancelled,
    and the node waited for until idle (at most a connect timeout; the flush that follows
    finds it idle or not). Nobody may read that decode any more: its holder died, or is
    paused and stops at its next line once it finds its lease lost. Left running, it would
    keep the node out until its last token (minutes, for a long answer).

    A TileRT 0.1.5 node cancels only once its first line is out; during its wait for the
    transfer, the decode ends when that wait does (which the claim's quiet time covers). A
    holder paused with its connection's buffers full keeps a node's response from ending
    until it reads again or its connection drops: nothing on the node's API frees it.
    """
    if not await tilert.decoding(upstreams, node, rid):
        return
    cancelled = await tilert.cancel(upstreams, node, rid)
    log.warning(
        "node %s: the decode of %s ran on past its lease; %s",
        node.id,
        rid,
        "cancelled" if cancelled else "the node did not take the cancel",
    )
    if cancelled:
        metrics.cancelled(model, "lease_expired")
        await tilert.wait_idle(upstreams, node, limit_s=upstreams.timeouts.connect_s)


def _stale_transfer_quiet_s(upstreams: Upstreams, facts: NodeFactsBook, node: Node) -> float:
    """How long after a lease expired with its request's transfer still on its way the node
    stays out. A 0.1.6 node refuses that request's transfer once flushed in its name; a 0.1.5
    node takes any transfer that arrives, so it waits out the prefill's deadline."""
    known = facts.get(node.id)
    release = known.version if known is not None else node.tilert
    return 0.0 if release == "0.1.6" else upstreams.timeouts.prefill_s


async def flushed_and_ready(
    upstreams: Upstreams, metrics: Metrics, node: Node, *, rid: str | None = None
) -> tilert.FlushOutcome:
    """Healthy, flushed of any orphaned transfer (`rid`'s, if named), and idle (`clean`)."""
    if not await tilert.is_ready(upstreams, node):
        return "not_run"
    outcome = await tilert.flush(
        upstreams, node, idle_within_s=upstreams.timeouts.connect_s, rid=rid
    )
    metrics.flushed(node.id, clean=outcome == "clean")
    return outcome


async def admit_ready_nodes(
    pool: PoolAdmin,
    upstreams: Upstreams,
    facts: NodeFactsBook,
    metrics: Metrics,
    *,
    sole_user: bool,
) -> None:
    """At start-up: learn every node's facts. A node that is down, still decoding (a previous
    gateway's request) or of the wrong release starts out of service. `sole_user` (one
    gateway process owns the pool): flush each node now, since a previous process may have
    died between a prefill and its decode; with a shared pool, other replicas may be using
    the nodes, and orphans are found by their expired leases instead."""
    nodes = await pool.nodes()

    async def admit(node: Node) -> None:
        if not await learn(pool, upstreams, facts, node):
            return
        if sole_user:
            ready = await flushed_and_ready(upstreams, metrics, node) == "clean"
        else:
            ready = await tilert.is_ready(upstreams, node)
        if not ready:
            log.warning("node %s is not ready at start-up: out of service until it is", node.id)
            await pool.take_out(node.id, "not_ready_at_start")

    await asyncio.gather(*(admit(node) for node in nodes))
