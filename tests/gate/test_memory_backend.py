"""The memory backend's own bookkeeping, beyond the interface suite."""

from __future__ import annotations

import asyncio

from router.gate.memory import MemoryGate
from tests.gate.conftest import nodes


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_given_up_waiters_do_not_pile_up() -> None:
    gate = MemoryGate(nodes(1), max_queue=1000)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiters = [
        asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder=str(i))) for i in range(300)
    ]
    await settle()
    for w in waiters:
        w.cancel()
    await settle()
    assert (await gate.snapshot()).waiting == 0
    assert len(gate._waiters) < 150, "the heap was rebuilt"
    await held.release()
    assert (await gate.acquire(priority=0, wait_s=0, holder="b")).node == held.node
