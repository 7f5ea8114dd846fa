"""The TileRT slot gate: an interface and its state backends, chosen by `gate.backend`."""

from __future__ import annotations

from router.config import GateConfig, NodeConfig
from router.gate.base import Gate, GateRejected, GateSnapshot, Lease
from router.gate.memory import MemoryGate

__all__ = ["Gate", "GateRejected", "GateSnapshot", "Lease", "make_gate"]


def make_gate(config: GateConfig, nodes: list[NodeConfig]) -> Gate:
    if config.backend == "memory":
        return MemoryGate(nodes, max_queue=config.max_queue)
    raise ValueError(f"unknown gate backend {config.backend!r}")
