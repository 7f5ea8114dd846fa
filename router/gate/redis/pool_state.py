"""The pool's shared state as one `state` script read it, through the same health and
hold-time models the memory backend keeps (rebuilt from the shared state on each read)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from router.gate.base import GateSnapshot
from router.gate.circuit_breaker import NodeFailure, NodeHealth
from router.gate.hold_times import HoldTimeEstimator


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True, slots=True)
class PoolState:
    holders: dict[str, str | None]  # node id -> holder (None if free); held leaving ones too
    health: NodeHealth
    waiting: int
    hold_times: HoldTimeEstimator
    held_for: list[float]  # how long each held node in service has been held (seconds)

    @classmethod
    def read(
        cls,
        reply: Sequence[Any],
        node_ids: Sequence[str],
        leaving_ids: Sequence[str],
        *,
        threshold: int,
        cooldown_s: float,
    ) -> PoolState:
        """From `state.lua`'s {now ms, waiting, hold times (newest first), per node {holder, since,
        out_ms, reason, drained}, per leaving node its holder}."""
        now_ms, waiting, held, states, leaving = reply
        clock = _Clock()
        health = NodeHealth(node_ids, threshold=threshold, cooldown_s=cooldown_s, clock=clock)
        holders: dict[str, str | None] = {}
        since: dict[str, int] = {}
        for node_id, state in zip(node_ids, states, strict=True):
            holder, held_since, out_ms, reason, drained = state
            holders[node_id] = holder
            if held_since is not None:
                since[node_id] = int(held_since)
            if out_ms is not None:  # out since then, as if it had failed at that moment
                clock.now = int(out_ms) / 1000
                health.record(node_id, NodeFailure(reason or "", hard=True))
            if drained is not None:
                health.drain(node_id)
        for node_id, holder in zip(leaving_ids, leaving, strict=True):
            if holder is not None:
                holders[node_id] = holder
        clock.now = int(now_ms) / 1000
        hold_times = HoldTimeEstimator()
        for held_s in reversed(held):
            hold_times.observe(float(held_s))
        held_for = [
            (int(now_ms) - ms) / 1000 for node_id, ms in since.items() if health.usable(node_id)
        ]
        return cls(holders, health, int(waiting), hold_times, held_for)

    def retry_after_s(self) -> int:
        if self.health.in_service == 0:
            return max(1, math.ceil(self.health.seconds_until_probe()) + 1)
        return self.hold_times.retry_after_s(
            waiting=self.waiting, nodes=self.health.in_service, held_for=self.held_for
        )

    def expected_wait_s(self) -> float:
        free = any(
            holder is None and self.health.usable(node_id)
            for node_id, holder in self.holders.items()
        )
        if free and self.waiting == 0:
            return 0.0
        if self.health.in_service == 0:
            return math.inf
        return self.hold_times.expected_wait_s(
            waiting=self.waiting, nodes=self.health.in_service, held_for=self.held_for
        )

    def snapshot(self) -> GateSnapshot:
        return GateSnapshot(
            nodes=len(self.holders),
            busy=dict(self.holders),
            out=self.health.out(),
            waiting=self.waiting,
            retry_after_s=self.retry_after_s(),
            hold_s=self.hold_times.mean_s,
        )
