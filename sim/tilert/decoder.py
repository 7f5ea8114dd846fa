"""One decode on the node: multi-token steps, cancel, faults, and when the slot frees.

The producer runs as its own task, so a client that drops the connection does not stop
it (only /pd/cancel does, as on a real node). The node's lock is released when the
producer has finished *and* the response body has ended. The producer queues token
bursts (lists of ids), final objects (dicts), then None (or DIED); the HTTP layer turns
them into ndjson lines as the node's version does.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Final, Literal


class _Marker(enum.Enum):
    DIED = enum.auto()


DIED: Final = _Marker.DIED  # queue marker: drop the connection without a final line
Ending = dict[str, Any] | Literal[_Marker.DIED] | None
"""What ends a session's lines: a final object, then None; or DIED."""


def burst_sizes(tokens_per_step: float) -> Iterator[int]:
    """Tokens per step with the given mean, deterministically (3.2 → 3, 3, 3, 3, 4, …)."""
    rate = Fraction(str(tokens_per_step))
    emitted, total = 0, Fraction(0)
    while True:
        total += rate
        size = int(total) - emitted
        emitted += size
        yield size


class Hold:
    """A decode held before its first step (`hold_start`) until `POST /sim/release`."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.waiting = False
        """True while the decode waits at the hold: it has sent nothing and cannot."""


@dataclass(frozen=True, slots=True)
class DecodeFaults:
    """Faults fixed for one decode when it starts."""

    stall_after: int | None = None
    die_after: int | None = None
    error_after: int | None = None
    slow_start_s: float = 0.0
    hold: Hold | None = None

    @property
    def trigger(self) -> int | None:
        """Token count at which the first armed stream fault fires."""
        armed = [n for n in (self.stall_after, self.die_after, self.error_after) if n is not None]
        return min(armed) if armed else None


@dataclass(frozen=True, slots=True)
class DecodeJob:
    """What to decode: the rid, the first token, the budget and the planned continuation."""

    rid: str
    first_token_id: int
    max_tokens: int
    continuation: list[int]
    eos_ids: tuple[int, ...]
    prompt_seq_len: int


class DecodeSession:
    """Holds the node's lock for one /pd/decode call from arrival to release."""

    def __init__(self, rid: str, on_release: Callable[[DecodeSession], None]) -> None:
        self.rid = rid
        self.cancelled = asyncio.Event()
        self.cancellable = True  # /pd/cancel finds it (0.1.5: only once decoding)
        self.lines: asyncio.Queue[list[int] | Ending] = asyncio.Queue()
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.seq_len = 0
        self._on_release = on_release
        self._arrived = time.monotonic()
        self._kv_ready = self._arrived
        self._producer: asyncio.Task[None] | None = None
        self._producer_done = False
        self._body_done = False
        self._released = False

    def cancel(self) -> None:
        """Stop the decode at the next step (or the wait for the transfer)."""
        self.cancelled.set()

    def start(
        self, job: DecodeJob, step_s: float, tokens_per_step: float, faults: DecodeFaults
    ) -> None:
        """Begin producing lines for ``job`` in the background."""
        self._kv_ready = time.monotonic()
        self.seq_len = job.prompt_seq_len
        self._producer = asyncio.create_task(self._produce(job, step_s, tokens_per_step, faults))

    async def finished(self) -> None:
        """Wait until the producer has ended."""
        if self._producer is not None:
            await asyncio.shield(self._producer)

    def end_without_decode(self) -> None:
        """Release the lock of a call that never started decoding (timeout, errors)."""
        self._producer_done = True
        self.body_ended()

    def body_ended(self) -> None:
        """The response body has ended (or its client is gone): release if the decode has too."""
        self._body_done = True
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self._producer_done and self._body_done and not self._released:
            self._released = True
            self._on_release(self)

    def timing_ms(self) -> dict[str, Any]:
        """Phases of this call in milliseconds, as TileRT reports them (+ finish_reason)."""
        now = time.monotonic()
        return {
            "wire_wait": round((self._kv_ready - self._arrived) * 1000, 1),
            "convert": 0.0,
            "inject": 0.0,
            "decode": round((now - self._kv_ready) * 1000, 1),
            "finish_reason": self.finish_reason,
        }

    def done_line(self) -> dict[str, Any]:
        """The final ndjson object of a stream that ended normally or by cancel."""
        return {
            "done": True,
            "n": len(self.token_ids),
            "seq_len": self.seq_len,  # the prompt length, as TileRT reports it
            "finish_reason": self.finish_reason,
            "timing_ms": self.timing_ms(),
        }

    async def _pause(self, seconds: float) -> bool:
        """Sleep, waking early on cancel; True if cancelled."""
        if self.cancelled.is_set():
            return True
        try:
            await asyncio.wait_for(self.cancelled.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _held(self, hold: Hold) -> bool:
        """Wait until `hold` is released, or the decode is cancelled; True if cancelled."""
        released = asyncio.ensure_future(hold.released.wait())
        cancelled = asyncio.ensure_future(self.cancelled.wait())
        hold.waiting = True
        try:
            await asyncio.wait([released, cancelled], return_when=asyncio.FIRST_COMPLETED)
        finally:
            hold.waiting = False
            released.cancel()
            cancelled.cancel()
        return self.cancelled.is_set()

    def _emit(self, message: dict[str, Any] | list[int]) -> None:
        self.lines.put_nowait(message)

    async def _produce(
        self, job: DecodeJob, step_s: float, tokens_per_step: float, faults: DecodeFaults
    ) -> None:
        try:
            await self._generate(job, step_s, tokens_per_step, faults)
        finally:
            self._producer_done = True
            self._maybe_release()

    async def _generate(
        self, job: DecodeJob, step_s: float, tokens_per_step: float, faults: DecodeFaults
    ) -> None:
        if faults.slow_start_s and await self._pause(faults.slow_start_s):
            return self._finish("cancelled")
        if faults.hold is not None and await self._held(faults.hold):
            return self._finish("cancelled")
        if job.max_tokens <= 0:
            # No budget: the first token (the prefill's) is the whole output, counted though
            # never streamed, as TileRT's engines of both releases answer (tests/real_tilert).
            self.token_ids.append(job.first_token_id)
            return self._finish("length")
        if job.first_token_id in job.eos_ids:
            # The engine streams the first token before it checks the stop set.
            self._emit([job.first_token_id])
            return self._finish("stop")
        tokens = iter([job.first_token_id, *job.continuation])
        bursts = burst_sizes(tokens_per_step)
        trigger = faults.trigger
        while True:
            if trigger is not None and len(self.token_ids) >= trigger:
                return await self._fault(faults)
            if await self._pause(step_s):
                return self._finish("cancelled")
            burst: list[int] = []
            reason = None
            for _ in range(next(bursts)):
                token = next(tokens, None)
                if token is None or token in job.eos_ids:
                    reason = "stop"  # the stop token itself is never emitted
                    break
                burst.append(token)
                produced = len(self.token_ids) + len(burst)
                if produced == job.max_tokens:
                    reason = "length"
                    break
                if produced == trigger:
                    break
            if burst:
                self.token_ids.extend(burst)
                self._emit(burst)
            if reason is not None:
                return self._finish(reason)

    async def _fault(self, faults: DecodeFaults) -> None:
        count = len(self.token_ids)
        if faults.die_after is not None and faults.die_after <= count:
            self.finish_reason = "died"
            self.lines.put_nowait(DIED)
        elif faults.error_after is not None and faults.error_after <= count:
            self.finish_reason = "error"
            self._emit({"error": "decode stalled"})
            self.lines.put_nowait(None)
        else:
            await self.cancelled.wait()  # stalled: silent until cancelled
            self._finish("cancelled")

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self._emit(self.done_line())
        self.lines.put_nowait(None)
