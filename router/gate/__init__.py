"""The TileRT slot gate: an interface and its state backends, chosen by `gate.backend`."""

from __future__ import annotations

from router.config import GateConfig
from router.gate.base import (
    CONTINUING,
    DEFAULT_TENANT,
    UNSHARED,
    Gate,
    GateRejected,
    GateSnapshot,
    Lease,
    PoolAdmin,
    ProbeClaim,
    Share,
    SlotGate,
)
from router.gate.circuit_breaker import NodeFailure, failure_for
from router.gate.events import UNRECORDED, GateEvents
from router.gate.memory import MemoryGate
from router.node import Node

__all__ = [
    "CONTINUING",
    "DEFAULT_TENANT",
    "UNSHARED",
    "Gate",
    "GateRejected",
    "GateSnapshot",
    "Lease",
    "NodeFailure",
    "PoolAdmin",
    "ProbeClaim",
    "Share",
    "SlotGate",
    "failure_for",
    "make_gate",
]


def make_gate(
    config: GateConfig,
    nodes: list[Node],
    metrics: GateEvents | None = None,
    *,
    pool_id: str = "",
) -> Gate:
    """The pool of `nodes` on the configured backend; `metrics` records its leases.
    `pool_id` names the pool across replicas (the model it serves)."""
    metrics = metrics or UNRECORDED
    if config.backend == "memory":
        return MemoryGate(
            nodes,
            max_queue=config.max_queue,
            failure_threshold=config.failure_threshold,
            cooldown_s=config.node_cooldown_s,
            metrics=metrics,
        )
    if config.backend == "redis":
        from router.gate.redis import make_redis_gate  # the Redis client, only when used

        return make_redis_gate(config, nodes, metrics, pool_id=pool_id)
    raise ValueError(f"unknown gate backend {config.backend!r}")
