"""The node's single receive slot: control-plane transfers from request to completion.

One transfer may be in progress at a time; a request for a different rid is refused while
it is incomplete and younger than the request timeout. A transfer completes when every
configured sender rank has sent done; completed transfers wait, by rid, for /pd/decode.
The simulated data plane deposits each rid's planned output here, in either order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Transfer:
    """One rid's KV transfer as the node sees it."""

    rid: str
    seq_len: int
    last_prompt_token: int
    sampling: dict[str, Any] | None
    started: float
    ranks_done: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a control-plane request was refused: the exact error message to send."""

    message: dict[str, Any]
    outcome: str


class ReceiveSlot:
    """Transfer bookkeeping for one node (single event loop, no locking needed)."""

    def __init__(
        self,
        sender_ranks: frozenset[int],
        max_seq_len: int,
        request_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ranks = sender_ranks
        self._max_seq_len = max_seq_len
        self._timeout = request_timeout_s
        self._clock = clock
        self.in_progress: Transfer | None = None
        self.completed: dict[str, Transfer] = {}
        self._plans: dict[str, tuple[float, list[int]]] = {}
        self._waiters: dict[str, asyncio.Event] = {}

    @property
    def receiving(self) -> bool:
        """True while a live (not timed-out) transfer is incomplete."""
        current = self.in_progress
        return current is not None and self._clock() - current.started < self._timeout

    def open(
        self,
        rid: str,
        rank: int,
        seq_len: int,
        last_prompt_token: int,
        sampling: dict[str, Any] | None,
    ) -> Refusal | None:
        """Admit a sender's request, or say why it is refused."""
        if seq_len > self._max_seq_len:
            return Refusal({"error": "seq_len exceeds max_seq_len"}, "refused_seq_len")
        current = self.in_progress
        if current is not None and current.rid == rid:
            return None
        if current is not None and self.receiving:
            return Refusal({"error": "busy", "busy_rid": current.rid}, "refused_busy")
        self.in_progress = Transfer(rid, seq_len, last_prompt_token, sampling, self._clock())
        return None

    def done(self, rid: str, rank: int) -> bool:
        """Record a rank's done; True if this completed the transfer."""
        current = self.in_progress
        if current is None or current.rid != rid:
            return False
        current.ranks_done.add(rank)
        if not self._ranks <= current.ranks_done:
            return False
        self.in_progress = None
        self.completed[rid] = current
        waiter = self._waiters.get(rid)
        if waiter is not None:
            waiter.set()
        return True

    def put_plan(self, rid: str, output_ids: list[int]) -> None:
        """Keep the planned output the data plane delivered for ``rid``."""
        now = self._clock()
        self._plans = {r: p for r, p in self._plans.items() if now - p[0] < self._timeout}
        self._plans[rid] = (now, output_ids)

    async def wait_complete(self, rid: str, timeout_s: float, cancelled: asyncio.Event) -> bool:
        """Wait until ``rid``'s transfer is complete; False on timeout or cancel."""
        if rid in self.completed:
            return True
        waiter = self._waiters.setdefault(rid, asyncio.Event())
        complete = asyncio.ensure_future(waiter.wait())
        cancel = asyncio.ensure_future(cancelled.wait())
        try:
            await asyncio.wait({complete, cancel}, timeout=timeout_s, return_when="FIRST_COMPLETED")
        finally:
            complete.cancel()
            cancel.cancel()
            self._waiters.pop(rid, None)
        return rid in self.completed

    def take(self, rid: str) -> tuple[Transfer, list[int] | None]:
        """Consume ``rid``'s completed transfer and its plan (if the data plane sent one)."""
        transfer = self.completed.pop(rid)
        plan = self._plans.pop(rid, None)
        return transfer, None if plan is None else plan[1]

    def drop_stale(self, keep_rid: str) -> list[str]:
        """Drop completed-but-unconsumed transfers of other rids; return their rids."""
        stale = [rid for rid in self.completed if rid != keep_rid]
        for rid in stale:
            del self.completed[rid]
            self._plans.pop(rid, None)
        return stale

    def reset(self) -> None:
        """Forget every transfer and plan."""
        self.in_progress = None
        self.completed.clear()
        self._plans.clear()
