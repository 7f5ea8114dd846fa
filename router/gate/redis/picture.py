"""The pool as one STATE script saw it, read through the same health and hold-time models
the memory backend keeps (rebuilt from the shared state on each read)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.gate.base import GateSnapshot
from router.gate.health import NodeFailure, NodeHealth
from router.gate.hold_times import HoldTimeEstimator


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class Picture:
    holders: dict[str, str | None]  # node id -> holder (None if free)
    health: NodeHealth
    waiting: int
    hold_times: HoldTimeEstimator

    @classmethod
    def read(
        cls, reply: Sequence[Any], node_ids: Sequence[str], *, threshold: int, cooldown_s: float
    ) -> Picture:
        """From STATE's {now ms, waiting, hold times (newest first), per node {holder,
        out_ms, reason, drained}}."""
        now_ms, waiting, held, states = reply
        clock = _Clock()
        health = NodeHealth(node_ids, threshold=threshold, cooldown_s=cooldown_s, clock=clock)
        holders: dict[str, str | None] = {}
        for node_id, (holder, out_ms, reason, drained) in zip(node_ids, states, strict=True):
            holders[node_id] = holder
            if out_ms is not None:  # out since then, as if it had failed at that moment
                clock.now = int(out_ms) / 1000
                health.record(node_id, NodeFailure(reason or "", hard=True))
            if drained is not None:
                health.drain(node_id)
        clock.now = int(now_ms) / 1000
        hold_times = HoldTimeEstimator()
        for held_s in reversed(held):
            hold_times.observe(float(held_s))
        return cls(holders, health, int(waiting), hold_times)

    def retry_after_s(self) -> int:
        if self.health.in_service == 0:
            return max(1, math.ceil(self.health.seconds_until_probe()) + 1)
        return self.hold_times.retry_after_s(waiting=self.waiting, nodes=self.health.in_service)

    def snapshot(self) -> GateSnapshot:
        return GateSnapshot(
            nodes=len(self.holders),
            busy=dict(self.holders),
            out=self.health.out(),
            waiting=self.waiting,
            retry_after_s=self.retry_after_s(),
        )
