"""Where a deployment's gate state lives in Redis: every key and the wake-up channels.

Every name starts with the deployment's base: its key prefix, in braces on a Redis Cluster
(`{pdgw}`), so that all of a deployment's keys hash to one slot. One slot per deployment,
not per pool: pools of two models may share a node, and a reload that changes a pool's
node list changes the pool's id while its nodes keep their leases, so a node's lease must
sit beside every queue that may grant it. On a single server or behind Sentinel the prefix
is used as it is, which keeps the names an earlier release used for nodes and leases.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PoolKeys:
    """One pool's keys, in the order every script declares them (KEYS[1..10])."""

    queue: str  # zset: waiters, score -priority * 2^40 + when due (ms since 2024-01-01)
    wait: str  # hash: waiter -> "<expires ms>|<holder>"
    held: str  # list: recent hold times (seconds), newest first
    epoch: str  # string: set when the pool's state is first found empty
    grants: str  # hash: queued waiter -> "<expires ms>|<node id>", until it claims it
    gone: str  # zset: waiters that gave up, scored by when the mark expires (ms)
    alive: str  # zset: the deployment's replicas, scored by when their heartbeat expires
    shares: str  # hash: tenant -> its virtual node time (s), and "|clock" (fair_share.py)
    shared: str  # hash: waiter -> "<tenant>|<weight>|<max_nodes>", unless the default share
    format: str  # string: the newest version of this layout written (state_format.py)

    def declared(self) -> list[str]:
        return [
            self.queue,
            self.wait,
            self.held,
            self.epoch,
            self.grants,
            self.gone,
            self.alive,
            self.shares,
            self.shared,
            self.format,
        ]


class KeyLayout:
    def __init__(self, prefix: str, *, cluster: bool) -> None:
        self.base = f"{{{prefix}}}" if cluster else prefix
        self.channel = f"{self.base}:wake"  # pub/sub: waiters that must look again
        self.nodes = f"{self.base}:nodes"  # hash: node id -> its shared record (records.py)
        self.alive = f"{self.base}:alive"
        self.format = f"{self.base}:format"

    def replica_channel(self, replica: str) -> str:
        """The channel that names a replica's own waiters to it (the scripts build the same
        name: the deployment's channel, `/`, the replica's id)."""
        return f"{self.channel}/{replica}"

    def pool(self, pool_id: str, node_ids: Iterable[str]) -> PoolKeys:
        """The keys of the pool that serves `pool_id` (the model) from `node_ids` (as listed
        in the configuration: a node found by discovery joins a pool without changing it)."""
        listed = "\n".join([pool_id, *sorted(node_ids)])
        queue = f"{self.base}:pool:{hashlib.sha256(listed.encode()).hexdigest()[:16]}:queue"
        return PoolKeys(
            queue=queue,
            wait=f"{queue}:wait",
            held=f"{queue}:held",
            epoch=f"{queue}:epoch",
            grants=f"{queue}:grants",
            gone=f"{queue}:gone",
            alive=self.alive,
            shares=f"{queue}:shares",
            shared=f"{queue}:shared",
            format=self.format,
        )

    def node(self, node_id: str) -> list[str]:
        """One node's keys, in the order every script declares them: its state (hash:
        failures, out_ms + reason, drained, token, held), its lease (hash: owner, holder,
        token, since; expires after the lease TTL) and its probe claim (string: the replica
        flushing it before readmission)."""
        return [
            f"{self.base}:node:{node_id}",
            f"{self.base}:lease:{node_id}",
            f"{self.base}:probe:{node_id}",
        ]
