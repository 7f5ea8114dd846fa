"""The node's single receive slot, as TileRT 0.1.5 and 0.1.6 each keep it (docs/protocols.md
§1.5, §1.6).

Both versions hold one transfer (``current``) and a queue of completed transfers that
/pd/decode drains in arrival order. They differ in how the slot is freed:

* **0.1.5**: a rid is refused ``busy`` only while another transfer is incomplete and
  younger than the request timeout; a new rid replaces a completed one; ``release()``
  erases whatever the slot holds, whoever calls it.
* **0.1.6**: the slot has a state (reserved, transferring, complete, cancelling; free when
  empty), every admission gets a generation, ``release(rid)`` frees the slot only if it
  still holds ``rid`` (and marks it ``cancelling`` while a sender is still writing), and a
  released rid is refused ``cancelling`` / ``no_consumer`` until its tombstone expires or
  a new /pd/decode for it arrives.

Whatever else happens, one receive buffer backs the slot: admitting a new rid while a
completed transfer waits undecoded overwrites it, which the node records as corruption.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

Protocol = Literal["0.1.5", "0.1.6"]
PROTOCOLS: tuple[Protocol, ...] = ("0.1.5", "0.1.6")

FREE, RESERVED, TRANSFERRING, COMPLETE, CANCELLING = (
    "free",
    "reserved",
    "transferring",
    "complete",
    "cancelling",
)


class ControlRequest(TypedDict):
    """A sender's request frame, its fields' types checked (docs/protocols.md §1.3)."""

    rid: str
    rank: int
    seq_len: int
    last_prompt_token: int
    sampling: NotRequired[dict[str, Any] | None]
    admission_window_s: NotRequired[object]  # 0.1.6 senders; used if it reads as a number


@dataclass(slots=True)
class Transfer:
    """One rid's KV transfer as the node sees it."""

    rid: str
    seq_len: int
    last_prompt_token: int
    sampling: dict[str, Any] | None
    started: float
    generation: int = 0
    state: str = RESERVED
    writers: int = 0
    ranks_done: set[int] = field(default_factory=set)
    overwritten_by: str | None = None  # a later write landed in the buffer before the decode


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a control-plane request was refused: the exact frame to send, and the record."""

    message: dict[str, Any]
    outcome: str


@dataclass(frozen=True, slots=True)
class Admission:
    """An admitted request: the frame to send (0.1.6 only) and any transfer it overwrote."""

    transfer: Transfer
    message: dict[str, Any] | None
    overwrote: Transfer | None = None


class Cancelled:
    """Marker: the wait for a transfer ended by /pd/cancel (0.1.6)."""


CANCELLED = Cancelled()


class ReceiveSlot:
    """Transfer bookkeeping for one node (single event loop, no locking needed)."""

    def __init__(
        self,
        sender_ranks: frozenset[int],
        max_seq_len: int,
        request_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        protocol: Protocol = "0.1.6",
        on_corruption: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.protocol = protocol
        self._on_corruption = on_corruption
        self._ranks = sender_ranks
        self._max_seq_len = max_seq_len
        self._timeout = request_timeout_s
        self._clock = clock
        self.current: Transfer | None = None
        self.queue: deque[Transfer] = deque()
        self._tombstones: dict[str, float] = {}
        self._generation = 0
        self._plans: dict[str, tuple[float, list[int]]] = {}
        self._arrived = asyncio.Event()
        self.refused_busy: dict[str, tuple[float, str]] = {}  # rid -> (when, busy rid)

    @property
    def v16(self) -> bool:
        """Whether this slot behaves as TileRT 0.1.6's."""
        return self.protocol == "0.1.6"

    # -- state ------------------------------------------------------------------------

    def _young(self, transfer: Transfer) -> bool:
        return self._clock() - transfer.started < self._timeout

    def _reusable(self, current: Transfer) -> bool:
        """0.1.6: may another rid take the slot?"""
        if current.state == COMPLETE:
            return True
        if current.writers > 0:
            return False
        if current.state in (FREE, CANCELLING):
            return True
        return not self._young(current)

    @property
    def advisory_busy(self) -> bool:
        """``hello.busy``: 0.1.5 — a transfer is incomplete; 0.1.6 — the slot is not reusable."""
        current = self.current
        if current is None:
            return False
        if self.v16:
            return not self._reusable(current)
        return current.state != COMPLETE

    @property
    def receiving(self) -> bool:
        """True while a live (not timed-out) transfer is incomplete."""
        current = self.current
        return current is not None and current.state != COMPLETE and self._young(current)

    @property
    def state(self) -> str:
        """The slot's state as 0.1.6 names it."""
        return self.current.state if self.current is not None else FREE

    # -- control plane ----------------------------------------------------------------

    def seq_len_refusal(self, rid: str, seq_len: int) -> Refusal | None:
        """The refusal of a request whose ``seq_len`` exceeds ``max_seq_len``, if it does."""
        if seq_len <= self._max_seq_len:
            return None
        message: dict[str, Any] = {"error": "seq_len exceeds max_seq_len"}
        if self.v16:
            message = {"accepted": False, **message, "rid": rid, "max_seq_len": self._max_seq_len}
        return Refusal(message, "refused_seq_len")

    def busy_refusal(self, busy_rid: str, busy_state: str) -> Refusal:
        """A ``busy`` refusal in this version's shape."""
        if self.v16:
            message = {
                "accepted": False,
                "error": "busy",
                "busy_rid": busy_rid,
                "busy_state": busy_state,
            }
        else:
            message = {"error": "busy", "busy_rid": busy_rid}
        return Refusal(message, "refused_busy")

    def admit(self, request: ControlRequest) -> Admission | Refusal:
        """Admit a sender's request (seq_len already checked), or say why it is refused."""
        rid = request["rid"]
        outcome = self._admit_v16(request) if self.v16 else self._admit_v15(request)
        if isinstance(outcome, Refusal) and outcome.outcome == "refused_busy":
            busy_rid = str(outcome.message.get("busy_rid"))
            plan = self._plans.get(rid)
            if plan is not None and self._clock() - plan[0] < self._timeout:
                self._corrupt(rid, "write_while_busy")  # its write came before the refusal
            else:
                self.refused_busy[rid] = (self._clock(), busy_rid)
        elif isinstance(outcome, Admission):
            self.refused_busy.pop(rid, None)
            if outcome.overwrote is not None:
                self._report(rid, outcome.overwrote.rid, "overwrote_complete")
        return outcome

    def _report(self, rid: str, victim: str, kind: str) -> None:
        if self._on_corruption is not None:
            self._on_corruption(rid, victim, kind)

    def _corrupt(self, rid: str, kind: str) -> None:
        """A write by ``rid`` landed in the buffer; corrupt whatever undecoded transfer it holds."""
        current = self.current
        if current is None or current.rid == rid:
            return
        if current.state == COMPLETE and current not in self.queue:
            return  # already decoded: nothing left to corrupt
        current.overwritten_by = rid
        self._report(rid, current.rid, kind)

    def _new(self, request: ControlRequest) -> tuple[Transfer, Transfer | None]:
        previous = self.current
        overwrote = None
        if previous is not None and previous.state == COMPLETE and previous in self.queue:
            previous.overwritten_by = request["rid"]
            overwrote = previous
        self._generation += 1
        self.current = Transfer(
            rid=request["rid"],
            seq_len=int(request["seq_len"]),
            last_prompt_token=int(request.get("last_prompt_token", 0)),
            sampling=request.get("sampling"),
            started=self._clock(),
            generation=self._generation,
        )
        return self.current, overwrote

    def _admit_v15(self, request: ControlRequest) -> Admission | Refusal:
        current = self.current
        if current is not None and current.rid == request["rid"]:
            return Admission(current, None)
        if current is not None and current.state != COMPLETE and self._young(current):
            return self.busy_refusal(current.rid, current.state)
        transfer, overwrote = self._new(request)
        transfer.state = TRANSFERRING
        return Admission(transfer, None, overwrote)

    def _admit_v16(self, request: ControlRequest) -> Admission | Refusal:
        rid, rank = request["rid"], request["rank"]
        if self._tombstoned(rid):
            self._extend_tombstone(rid, request.get("admission_window_s"))
            message = {"accepted": False, "error": "cancelling", "rid": rid}
            message["detail"] = "no_consumer"
            return Refusal(message, "refused_cancelling")
        current = self.current
        overwrote = None
        if current is not None and current.rid == rid:
            if current.state == CANCELLING:
                message = {"accepted": False, "error": "cancelling", "rid": rid}
                return Refusal(message, "refused_cancelling")
            if rank in current.ranks_done:
                message = {"accepted": False, "error": "duplicate_rank", "rid": rid, "rank": rank}
                return Refusal(message, "refused_duplicate_rank")
        elif current is not None and not self._reusable(current):
            return self.busy_refusal(current.rid, current.state)
        else:
            current, overwrote = self._new(request)
        current.state = TRANSFERRING
        current.writers += 1
        message = {"accepted": True, "rid": rid, "rank": rank, "generation": current.generation}
        return Admission(current, message, overwrote)

    def writer_left(self, transfer: Transfer) -> None:
        """0.1.6: an admitted sender's connection ended (after done or not)."""
        current = self.current
        if current is not transfer:
            return
        current.writers = max(0, current.writers - 1)
        if current.state == CANCELLING and current.writers == 0:
            self.current = None

    def done(self, transfer: Transfer, rank: int) -> bool:
        """A done on the connection that admitted ``transfer`` (whatever rid the frame names).

        True if this completed the transfer.
        """
        current = self.current
        if current is None or current.state == CANCELLING:
            return False
        if current is not transfer and (self.v16 or current.rid != transfer.rid):
            return False  # 0.1.6 matches the generation, 0.1.5 only the rid
        current.ranks_done.add(rank)
        if not self._ranks <= current.ranks_done:
            return False
        current.state = COMPLETE
        self.queue.append(current)
        self._arrived.set()
        return True

    # -- the decode's side ----------------------------------------------------------------

    def release(self, rid: str) -> None:
        """A decode of ``rid`` ended (or a stale transfer of ``rid`` was dropped)."""
        if not self.v16:
            self.current = None  # 0.1.5 erases whatever the slot holds
            return
        self._tombstone(rid)
        current = self.current
        if current is None or current.rid != rid:
            return
        if current.writers > 0 and current.state != COMPLETE:
            current.state = CANCELLING
            return
        self.current = None

    def expect(self, rid: str) -> None:
        """0.1.6: a /pd/decode for ``rid`` arrived; forget its tombstone."""
        self._tombstones.pop(rid, None)

    def _tombstone(self, rid: str) -> None:
        now = self._clock()
        self._tombstones = {r: t for r, t in self._tombstones.items() if t > now}
        self._tombstones[rid] = now + self._timeout

    def _extend_tombstone(self, rid: str, window_s: object) -> None:
        if not isinstance(window_s, int | float | str):
            return
        try:
            window = float(window_s)
        except ValueError:
            return
        if window > 0:
            self._tombstones[rid] = max(self._tombstones.get(rid, 0.0), self._clock() + window)

    def _tombstoned(self, rid: str) -> bool:
        deadline = self._tombstones.get(rid)
        if deadline is None:
            return False
        if deadline <= self._clock():
            del self._tombstones[rid]
            return False
        return True

    async def next_completed(
        self, timeout_s: float, cancelled: asyncio.Event | None
    ) -> Transfer | Cancelled | None:
        """The oldest completed transfer, waiting up to ``timeout_s``; None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            if cancelled is not None and cancelled.is_set():
                return CANCELLED
            if self.queue:
                return self.queue.popleft()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            self._arrived.clear()
            waits = {asyncio.ensure_future(self._arrived.wait())}
            if cancelled is not None:
                waits.add(asyncio.ensure_future(cancelled.wait()))
            try:
                await asyncio.wait(waits, timeout=remaining, return_when="FIRST_COMPLETED")
            finally:
                for waiter in waits:
                    waiter.cancel()

    # -- the simulated data plane ---------------------------------------------------------

    def put_plan(self, rid: str, output_ids: list[int]) -> None:
        """Keep the planned output the data plane delivered for ``rid``.

        A write by a rid the node refused ``busy`` (a sender that did not read the refusal)
        lands in the buffer of the transfer the slot holds: corruption.
        """
        now = self._clock()
        self._plans = {r: p for r, p in self._plans.items() if now - p[0] < self._timeout}
        self._plans[rid] = (now, output_ids)
        if self.refused_busy.pop(rid, None) is not None:
            self._corrupt(rid, "write_while_busy")

    def plan(self, rid: str) -> list[int] | None:
        """Consume the plan the data plane delivered for ``rid``, if any."""
        plan = self._plans.pop(rid, None)
        return None if plan is None else plan[1]

    def snapshot(self) -> dict[str, Any]:
        """The slot for ``/sim/records``."""
        current = self.current
        return {
            "state": self.state,
            "rid": current.rid if current else None,
            "generation": current.generation if current else None,
            "writers": current.writers if current else 0,
            "queued": [t.rid for t in self.queue],
            "tombstones": sorted(r for r in list(self._tombstones) if self._tombstoned(r)),
        }

    def reset(self) -> None:
        """Forget every transfer, plan and tombstone."""
        self.current = None
        self.queue.clear()
        self._tombstones.clear()
        self._plans.clear()
        self.refused_busy.clear()
