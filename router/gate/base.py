"""The gate's interface: one slot per TileRT node, waited for in a bounded queue served by
priority, then earliest deadline.

Callers (the latency path) see only `Gate` and `Lease`; the state behind them lives in a
backend (`memory` for one process; a shared store for several replicas) chosen by config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from router.gate.circuit_breaker import NodeFailure
from router.node import Node

RejectReason = Literal[
    "queue_full",
    "wait_timeout",
    "pool_saturated",
    "tenant_max_nodes",
    "no_node",
    "gate_unavailable",
]
"""`pool_saturated`: no slot free and no wait allowed (a `reject` rule).
`tenant_max_nodes`: the caller's tenant holds as many nodes as its share allows, and no
wait was allowed. `gate_unavailable`: the pool's shared state (a backend's store) could not
be reached."""

DEFAULT_TENANT = "default"
"""The tenant of requests that name none."""


@dataclass(frozen=True, slots=True)
class Share:
    """Whose request waits for a node, and its tenant's part of the pool: `weight` in the
    fair share of node time among the tenants waiting at one priority, and `max_nodes` the
    tenant may hold at once (None: no cap)."""

    tenant: str = DEFAULT_TENANT
    weight: float = 1.0
    max_nodes: int | None = None

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"a share's weight is above 0, not {self.weight}")
        if "|" in self.tenant or "\n" in self.tenant:
            raise ValueError(f"a tenant's name has no '|' or line break: {self.tenant!r}")


UNSHARED = Share()
"""A request of the default tenant, with no cap: every request before tenants were named."""


class GateRejected(Exception):
    """No slot could be had: the queue was full, the wait budget ran out, no node is usable,
    or the gate's shared state could not be reached."""

    def __init__(self, reason: RejectReason, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class Lease(Protocol):
    """One held slot. `release` is idempotent and must be called on every path."""

    @property
    def node(self) -> Node: ...

    @property
    def released(self) -> bool: ...

    async def release(
        self, failure: NodeFailure | None = None, *, reports_health: bool = True
    ) -> None:
        """Give the slot back, saying whether the node failed this request
        (`reports_health`: the request got far enough to say anything about the node's
        health)."""
        ...

    async def renew(self) -> bool:
        """Keep the slot while the request runs; False if it has been lost (the holder must
        then finish its node protocol and start nothing new on the node)."""
        ...

    def valid(self) -> bool:
        """Held for sure, as far as this process knows without asking anyone: cheap enough
        to check for every line of a decode, and checked before every call to the node."""
        ...

    def transfer_landed(self) -> None:
        """The request's KV transfer has reached the node: should the lease be lost from now
        on, nothing of this request is still on its way to the node."""
        ...


CONTINUING = 0.5
"""What an answer continued on another node adds to its rule's priority: a client mid-answer
waits for a node before the requests that have not started, not before higher priorities."""


@dataclass(frozen=True, slots=True)
class ProbeClaim:
    """The prober alone may flush an out-of-service node now."""

    stale_rid: str | None = None
    """The request whose lease expired on the node unreleased: the flush names it, so that
    a TileRT 0.1.6 node refuses its transfer should it still arrive."""


@dataclass(frozen=True, slots=True)
class GateSnapshot:
    nodes: int
    busy: dict[str, str | None]  # node id -> holder (None if free)
    out: dict[str, str]  # node id -> why it is out of service
    waiting: int
    retry_after_s: int
    hold_s: float | None = None
    """The mean time a node is held, as recent holds tell it (None: not told)."""


class SlotGate(Protocol):
    """What a request sees: a slot to wait for, and how long a refused client should wait."""

    async def acquire(
        self,
        *,
        priority: float,
        wait_s: float,
        holder: str,
        deadline_s: float | None = None,
        share: Share = UNSHARED,
    ) -> Lease:
        """Wait for a slot: higher priority first; within a priority, the tenant furthest
        behind its fair share of node time first (`share`, `fair_share.py`), and within a
        tenant the earliest deadline first. A tenant holding its `max_nodes` waits (or is
        refused with `tenant_max_nodes` when `wait_s` is 0) until one of its nodes is given
        back, whatever is free. A rule's
        priorities are whole numbers; an answer continued on another node asks with its
        rule's priority and a half (`CONTINUING`): ahead of its own priority's waiters,
        behind a higher one.

        `deadline_s`: seconds from now by which the caller must have its node to meet its
        objective. It only orders the queue: the caller gives up when `wait_s` passes, so one
        that must leave at its deadline passes `min(wait_s, deadline_s)` as `wait_s`. Without
        it the caller is due on arrival: waiters without deadlines keep arrival order, as
        fixed rules always did, and one with a deadline goes ahead of those that arrive after
        its deadline, behind those that arrived before it.

        Raises GateRejected when the queue is full, when `wait_s` passes, or when no node can
        serve. A cancelled caller never keeps a slot.
        """
        ...

    async def retry_after_s(self) -> int:
        """A Retry-After estimate from recent slot hold times and the queue ahead."""
        ...

    async def expected_wait_s(self) -> float:
        """How long a newcomer is expected to wait for a slot, for a prediction: 0 with a
        slot free and nobody waiting; else from the median hold time, how long the holders
        have held theirs and every waiter queued (whatever its priority); infinite while no
        node can serve or the pool's state cannot be read."""
        ...


class PoolAdmin(Protocol):
    """What the prober and operators see: the pool's nodes and their service state."""

    async def snapshot(self) -> GateSnapshot: ...

    async def nodes(self) -> list[Node]: ...

    async def due_for_probe(self) -> list[Node]:
        """Nodes out of service long enough to be probed."""
        ...

    async def claim_for_probe(
        self, node_id: str, *, for_s: float, quiet_s: float = 0.0
    ) -> ProbeClaim | None:
        """The node is out of service and, for `for_s`, only the caller may flush it and
        readmit it (so no replica's late flush can reach a node already back in service).
        None while the node may not be flushed: in service, held, claimed by another, or
        within `quiet_s` of a lease that expired while its request's transfer was still on
        its way (a flush cannot stop a TileRT 0.1.5 node from taking it later)."""
        ...

    async def release_probe_claim(self, node_id: str) -> None:
        """The caller's claim ends before its lifetime: its flush could not run yet (the node
        was busy or not ready), and the next probe, by any replica, may try again."""
        ...

    async def readmit(self, node_id: str) -> None:
        """A probed node is healthy and idle: back in service (unless another replica has
        claimed it meanwhile)."""
        ...

    async def take_out(self, node_id: str, reason: str) -> None:
        """Out of service now (a free node only), until probed ready."""
        ...

    async def retire(self, node_id: str, reason: str) -> None:
        """Out of service for a finding about the node itself (another release): a free node
        at once; a held one stays with its holder and is not granted again after its
        release. A node already out is out for `reason` from now on."""
        ...

    async def drain(self, node_id: str) -> bool:
        """An operator's drain: the node finishes its request and takes no more until
        `undrain`. False if the node is not in this pool."""
        ...

    async def undrain(self, node_id: str) -> bool: ...

    async def set_nodes(self, nodes: list[Node]) -> None:
        """A reload: nodes new to the pool join at once; nodes no longer in it finish their
        current request, take no more, and leave; a node whose settings changed keeps its
        state."""
        ...

    async def close(self) -> None:
        """Reject every waiter; leases still held may be released afterwards."""
        ...


class Gate(SlotGate, PoolAdmin, Protocol):
    """A backend implements both halves."""
