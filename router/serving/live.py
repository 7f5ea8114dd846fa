"""The answers being sent right now, so that shutdown can wait for them and, past its
grace period, end each one properly instead of dropping its connection."""

from __future__ import annotations

import asyncio
from typing import Protocol


class Cuttable(Protocol):
    def cut(self) -> None:
        """End the answer now: an error event and `[DONE]` if it is streaming, else a 503."""
        ...


class LiveResponses:
    def __init__(self) -> None:
        self._live: set[Cuttable] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, response: Cuttable) -> None:
        self._live.add(response)
        self._idle.clear()

    def discard(self, response: Cuttable) -> None:
        self._live.discard(response)
        if not self._live:
            self._idle.set()

    def __len__(self) -> int:
        return len(self._live)

    async def idle(self) -> None:
        """Return once no answer is being sent."""
        await self._idle.wait()

    def cut_all(self) -> None:
        for response in list(self._live):
            response.cut()
