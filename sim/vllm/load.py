"""The requests a server is working on: running ones, and waiting ones beyond --max-num-seqs."""

from __future__ import annotations

import asyncio
import math


class Ticket:
    """One admitted request; :meth:`release` (idempotent) ends its run."""

    def __init__(self, load: EngineLoad, blocks: int) -> None:
        self._load = load
        self.blocks = blocks
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._load._finish(self)


class EngineLoad:
    """Counts of running and waiting requests and the KV blocks the running ones hold."""

    def __init__(self, max_num_seqs: int | None, block_size: int, num_gpu_blocks: int) -> None:
        self._slots = asyncio.Semaphore(max_num_seqs) if max_num_seqs else None
        self._block_size = block_size
        self._num_gpu_blocks = num_gpu_blocks
        self.running = 0
        self.waiting = 0
        self._blocks_in_use = 0

    async def admit(self, tokens: int) -> Ticket:
        """Wait for a free sequence slot, then run a request of ``tokens`` tokens."""
        if self._slots is not None:
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        ticket = Ticket(self, math.ceil(tokens / self._block_size))
        self.running += 1
        self._blocks_in_use += ticket.blocks
        return ticket

    def _finish(self, ticket: Ticket) -> None:
        self.running -= 1
        self._blocks_in_use -= ticket.blocks
        if self._slots is not None:
            self._slots.release()

    @property
    def kv_cache_usage(self) -> float:
        """Share of the GPU blocks held by running requests (0 to 1)."""
        return min(self._blocks_in_use / self._num_gpu_blocks, 1.0)
