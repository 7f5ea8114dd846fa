"""Tenants share the pool, on every backend: within a priority the tenant furthest behind its
weighted share of node time is served first, and a tenant at its `max_nodes` waits (or is
refused) whatever is free, without double-booking anything."""

from __future__ import annotations

import asyncio

import pytest

from router.gate import Gate, GateRejected, Lease, Share
from tests.gate.conftest import MakeGate, nodes, waiting

GREEDY = Share("greedy")
INTERACTIVE = Share("interactive")


class Queued:
    """Waiters queued in order, each holding its node once granted until told to let go."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.tasks: dict[asyncio.Task[Lease], str] = {}

    async def add(self, name: str, share: Share, *, priority: float = 0) -> None:
        task = asyncio.create_task(
            self.gate.acquire(priority=priority, wait_s=30, holder=name, share=share)
        )
        self.tasks[task] = name
        await waiting(self.gate, len(self.tasks))  # queued in this order

    async def next_served(self) -> tuple[str, Lease]:
        """The one waiter the last release served (and no other)."""
        done, _ = await asyncio.wait(self.tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1, [self.tasks[t] for t in done]
        task = done.pop()
        return self.tasks.pop(task), task.result()

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_a_tenant_holding_nodes_waits_behind_one_holding_none(gate_of: MakeGate) -> None:
    """A node held counts at once (at least the pool's typical hold), so the greedy tenant's
    two nodes put the interactive tenant's waiters first, turn about, though all the
    greedy tenant's waiters arrived first."""
    gate = gate_of(nodes(2), max_queue=10)
    first = await gate.acquire(priority=0, wait_s=1, holder="g-a", share=GREEDY)
    second = await gate.acquire(priority=0, wait_s=1, holder="g-b", share=GREEDY)
    queued = Queued(gate)
    try:
        for name, share in [("g1", GREEDY), ("g2", GREEDY), ("i1", INTERACTIVE)]:
            await queued.add(name, share)
        await queued.add("i2", INTERACTIVE)
        order = []
        for release in (first, second):
            await release.release()
            name, lease = await queued.next_served()
            order.append(name)
            first = lease if name.startswith("i") else first
        assert order == ["i1", "g1"]
        await first.release()  # i1's: the greedy tenant holds one, the interactive none
        name, lease = await queued.next_served()
        assert name == "i2"
        await lease.release()
        name, lease = await queued.next_served()
        assert name == "g2"
        await lease.release()
    finally:
        await queued.close()


@pytest.mark.parametrize(("weight", "first"), [(1.0, "small"), (2.0, "big")])
async def test_a_heavier_weight_is_served_ahead_for_the_same_node_time(
    gate_of: MakeGate, weight: float, first: str
) -> None:
    """Each tenant holds one node: with equal weights the earlier waiter goes first; the
    tenant of weight 2 has used half the virtual time and goes first although later."""
    gate = gate_of(nodes(3), max_queue=10)
    big, small = Share("big", weight=weight), Share("small")
    await gate.acquire(priority=0, wait_s=1, holder="big-held", share=big)
    await gate.acquire(priority=0, wait_s=1, holder="small-held", share=small)
    other = await gate.acquire(priority=0, wait_s=1, holder="other", share=Share("other"))
    queued = Queued(gate)
    try:
        await queued.add("small", small)
        await queued.add("big", big)
        await other.release()
        name, _ = await queued.next_served()
        assert name == first
    finally:
        await queued.close()


async def test_priority_comes_before_the_share(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=10)
    held = await gate.acquire(priority=0, wait_s=1, holder="held", share=INTERACTIVE)
    queued = Queued(gate)
    try:
        await queued.add("interactive-low", INTERACTIVE)
        await queued.add("greedy-high", GREEDY, priority=5)
        await held.release()
        name, _ = await queued.next_served()
        assert name == "greedy-high"
    finally:
        await queued.close()


async def test_a_tenant_at_its_cap_waits_while_others_take_free_nodes(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(3), max_queue=10)
    capped = Share("capped", max_nodes=1)
    held = await gate.acquire(priority=0, wait_s=1, holder="capped-held", share=capped)
    with pytest.raises(GateRejected) as refused:
        await gate.acquire(priority=0, wait_s=0, holder="capped-now", share=capped)
    assert refused.value.reason == "tenant_max_nodes"
    queued = Queued(gate)
    try:
        await queued.add("capped-waits", capped)  # two nodes free, and it waits
        other = await gate.acquire(priority=0, wait_s=1, holder="other", share=INTERACTIVE)
        assert other.node.id != held.node.id
        assert (await gate.snapshot()).waiting == 1
        await held.release()
        name, lease = await queued.next_served()
        assert name == "capped-waits"
        busy = (await gate.snapshot()).busy
        assert sorted(h for h in busy.values() if h) == ["capped-waits", "other"]
        await lease.release()
        await other.release()
    finally:
        await queued.close()


async def test_a_capped_tenant_held_back_lets_the_next_tenant_have_the_node(
    gate_of: MakeGate,
) -> None:
    """The capped tenant's waiter is first in line, yet the freed node goes past it."""
    gate = gate_of(nodes(2), max_queue=10)
    capped = Share("capped", max_nodes=1)
    await gate.acquire(priority=0, wait_s=1, holder="capped-held", share=capped)
    other = await gate.acquire(priority=0, wait_s=1, holder="other", share=INTERACTIVE)
    queued = Queued(gate)
    try:
        await queued.add("capped-waits", capped, priority=5)
        await queued.add("interactive-waits", INTERACTIVE)
        await other.release()
        name, _ = await queued.next_served()
        assert name == "interactive-waits"
    finally:
        await queued.close()


async def test_a_capped_waiter_that_gives_up_leaves_nothing_behind(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=10)
    capped = Share("capped", max_nodes=1)
    held = await gate.acquire(priority=0, wait_s=1, holder="capped-held", share=capped)
    with pytest.raises(GateRejected) as refused:
        await gate.acquire(priority=0, wait_s=0.2, holder="capped-waits", share=capped)
    assert refused.value.reason == "wait_timeout"
    snapshot = await gate.snapshot()
    assert snapshot.waiting == 0
    assert sorted(h for h in snapshot.busy.values() if h) == ["capped-held"]
    await held.release()
    again = await gate.acquire(priority=0, wait_s=0, holder="capped-again", share=capped)
    await again.release()
