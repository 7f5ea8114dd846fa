"""Node health: passive failure counting takes a node out of the pool (a circuit breaker);
an active probe lets it back in once it answers `/health` and is idle.

A hard failure (the node is unreachable, or answers 429 although the gate believed it
free) trips the node at once; soft failures (a broken or stalled stream, a 500) trip it
after `threshold` in a row. Any success resets the count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeFailure:
    reason: str  # the error code, e.g. node_unreachable
    hard: bool


# DecodeError codes that say something about the node itself, and how strongly.
HARD = frozenset({"node_unreachable", "node_busy"})
# A transfer that never completes may be the prefill's fault, but a node whose control
# port cannot be reached fails every request that way: it counts, softly.
SOFT = frozenset(
    {
        "decode_truncated",
        "decode_stalled",
        "decode_failed",
        "decode_bad_line",
        "decode_timeout",
        "kv_transfer_timeout",
    }
)


FLUSH_ONLY = frozenset({"lease_expired", "state_lost"})
"""Out-of-service reasons that say nothing against the node: it may hold an orphaned
transfer (an expired lease), or serve a lease the pool's store forgot (a lost state), so it
is flushed once idle before it serves again, as soon as a prober can."""

EXPECTED_BACK = FLUSH_ONLY | {"decode_unfinished"}
"""Out-of-service reasons that end as soon as a probe sees the node idle and flushes it: a
pool whose nodes are all out for these is expected back shortly, so its waiters keep
waiting (within their budget). Any other reason (unreachable, refusing, failing, another
release, an operator's drain) may last: with every node out for one, waiting is pointless."""


def failure_for(code: str | None) -> NodeFailure | None:
    if code in HARD:
        return NodeFailure(code, hard=True)
    if code in SOFT:
        return NodeFailure(code, hard=False)
    return None


@dataclass(slots=True)
class _State:
    failures: int = 0
    out_since: float | None = None
    reason: str | None = None
    drained: bool = False  # an operator's decision: only an operator undoes it


class NodeHealth:
    """Per-node failure counts and the set of nodes out of service."""

    def __init__(
        self,
        node_ids: Iterable[str],
        *,
        threshold: int,
        cooldown_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._states = {node_id: _State() for node_id in node_ids}
        self._threshold = threshold
        self._cooldown_s = cooldown_s
        self._clock = clock

    def add(self, node_id: str) -> None:
        self._states.setdefault(node_id, _State())

    def remove(self, node_id: str) -> None:
        self._states.pop(node_id, None)

    def record(self, node_id: str, failure: NodeFailure | None) -> bool:
        """Count one outcome; True if the node has just been taken out."""
        state = self._states[node_id]
        if failure is None:
            state.failures = 0
            return False
        state.failures += 1
        if state.out_since is None and (failure.hard or state.failures >= self._threshold):
            state.out_since = self._clock()
            state.reason = failure.reason
            return True
        return False

    def take_out(self, node_id: str, reason: str) -> None:
        """Out of service now, for `reason`; a node already out is out for it from now on
        (the latest finding is the one that keeps it out)."""
        state = self._states[node_id]
        state.failures += 1
        if state.out_since is None:
            state.out_since = self._clock()
        state.reason = reason

    def usable(self, node_id: str) -> bool:
        """In service: neither out for failures nor drained."""
        state = self._states[node_id]
        return state.out_since is None and not state.drained

    def drain(self, node_id: str) -> None:
        self._states[node_id].drained = True

    def undrain(self, node_id: str) -> bool:
        """True if the node was drained."""
        state = self._states[node_id]
        was, state.drained = state.drained, False
        return was

    def readmit(self, node_id: str) -> bool:
        """Back in service; True if it was out."""
        state = self._states[node_id]
        was_out = state.out_since is not None
        state.failures, state.out_since, state.reason = 0, None, None
        return was_out

    def due_for_probe(self) -> list[str]:
        """Nodes out of service for at least the cool-down (a node out only to be flushed,
        after an expired lease, at once)."""
        now = self._clock()
        return [
            node_id
            for node_id, state in self._states.items()
            if state.out_since is not None
            and not state.drained
            and (state.reason in FLUSH_ONLY or now - state.out_since >= self._cooldown_s)
        ]

    def seconds_until_probe(self) -> float:
        """How soon the first node out of service is due for a probe (0 if one is due)."""
        now = self._clock()
        waits = [
            self._cooldown_s - (now - s.out_since)
            for s in self._states.values()
            if s.out_since is not None and not s.drained
        ]
        return max(0.0, min(waits, default=0.0))

    def out(self) -> dict[str, str]:
        """Nodes out of service and why (`drained` for an operator's drain)."""
        return {
            n: "drained" if s.drained else s.reason or ""
            for n, s in self._states.items()
            if s.out_since is not None or s.drained
        }

    @property
    def in_service(self) -> int:
        return sum(1 for s in self._states.values() if s.out_since is None and not s.drained)

    @property
    def expected(self) -> int:
        """Nodes in service, or out only until a probe flushes them (`EXPECTED_BACK`)."""
        return sum(
            1
            for s in self._states.values()
            if not s.drained and (s.out_since is None or s.reason in EXPECTED_BACK)
        )
