"""The gate interface, on every backend: one slot per node, served by priority then earliest
deadline (arrival order among equals), nothing leaked."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from router.gate import CONTINUING, Gate, GateRejected
from tests.gate.conftest import MakeGate, eventually, nodes, waiting


async def test_free_nodes_are_granted_at_once_one_each(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=4)
    a = await gate.acquire(priority=0, wait_s=1, holder="a")
    b = await gate.acquire(priority=0, wait_s=1, holder="b")
    assert {a.node.id, b.node.id} == {"127.0.0.1:6000", "127.0.0.1:6001"}
    assert (await gate.snapshot()).busy == {"127.0.0.1:6000": "a", "127.0.0.1:6001": "b"}


async def served_in_order(gate: Gate, queued: Sequence[tuple[str, float]]) -> list[str]:
    """The order in which waiters queued in `queued`'s order (name, priority) are served,
    once the pool's one node, held meanwhile, is released."""
    return await served_by_deadline(gate, [(name, priority, 5, None) for name, priority in queued])


async def served_by_deadline(
    gate: Gate, queued: Sequence[tuple[str, float, float, float | None]]
) -> list[str]:
    """`served_in_order` for waiters that give (name, priority, wait_s, deadline_s)."""
    held = await gate.acquire(priority=0, wait_s=1, holder="first")
    order: list[str] = []

    async def wait(name: str, priority: float, wait_s: float, deadline_s: float | None) -> None:
        lease = await gate.acquire(
            priority=priority, wait_s=wait_s, holder=name, deadline_s=deadline_s
        )
        order.append(name)
        await lease.release()

    tasks = []
    for waiter in queued:
        tasks.append(asyncio.create_task(wait(*waiter)))
        await waiting(gate, len(tasks))  # queued in this order
    await held.release()
    await asyncio.gather(*tasks)
    return order


async def test_service_order_is_priority_then_arrival(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=10)
    queued = [("low1", 0), ("high1", 5), ("low2", 0), ("high2", 5), ("mid", 2)]
    assert await served_in_order(gate, queued) == ["high1", "high2", "mid", "low1", "low2"]


async def test_a_continuing_answer_waits_ahead_of_its_own_priority_only(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=10)
    queued = [("low", 0), ("mid", 2), ("high", 5), ("mid-continuing", 2 + CONTINUING)]
    assert await served_in_order(gate, queued) == ["high", "mid-continuing", "mid", "low"]


async def test_within_a_priority_the_earliest_deadline_is_served_first(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=10)
    queued = [("late", 0, 60, 40), ("soon", 0, 60, 10), ("passed", 0, 60, -5)]
    assert await served_by_deadline(gate, queued) == ["passed", "soon", "late"]


async def test_a_waiter_without_a_deadline_is_due_on_arrival_whatever_its_budget(
    gate_of: MakeGate,
) -> None:
    """Fixed rules keep arrival order whatever their budgets; a deadline goes behind the
    waiters that arrived before it, ahead of those that come after it."""
    gate = gate_of(nodes(1), max_queue=10)
    queued = [
        ("patient", 0, 60, None),
        ("deadline-30", 0, 60, 30),
        ("hurried", 0, 20, None),
        ("passed", 0, 60, -30),
    ]
    assert await served_by_deadline(gate, queued) == [
        "passed",
        "patient",
        "hurried",
        "deadline-30",
    ]


async def test_a_higher_priority_is_served_before_an_earlier_deadline(gate_of: MakeGate) -> None:
    """A continuation's half priority too: ahead of its own priority's deadlines only."""
    gate = gate_of(nodes(1), max_queue=10)
    queued = [
        ("low-urgent", 0, 60, 1),
        ("mid", 2, 60, None),
        ("mid-continuing", 2 + CONTINUING, 60, 50),
        ("mid-urgent", 2, 60, 5),
        ("high", 5, 60, None),
    ]
    assert await served_by_deadline(gate, queued) == [
        "high",
        "mid-continuing",
        "mid",  # arrived before mid-urgent's deadline
        "mid-urgent",
        "low-urgent",
    ]


async def test_release_hands_the_slot_to_the_waiter_immediately(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=1)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    assert not waiter.done()
    await held.release()
    await eventually(waiter.done)  # handed over, not found by a poll (conftest)
    assert waiter.result().node == held.node
    assert (await gate.snapshot()).busy == {held.node.id: "b"}


async def test_full_queue_rejects_with_retry_after(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=1)
    await gate.acquire(priority=0, wait_s=1, holder="a")
    queued = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    with pytest.raises(GateRejected) as rejected:
        await gate.acquire(priority=9, wait_s=60, holder="c")
    assert rejected.value.reason == "queue_full"
    assert rejected.value.retry_after_s >= 1
    queued.cancel()


async def test_no_wait_allowed_is_a_saturated_pool(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    with pytest.raises(GateRejected) as rejected:
        await gate.acquire(priority=0, wait_s=0, holder="b")
    assert rejected.value.reason == "pool_saturated"
    assert (await gate.snapshot()).waiting == 0
    await held.release()


async def test_wait_budget_ends_in_rejection_and_leaves_no_waiter(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    with pytest.raises(GateRejected) as rejected:
        await gate.acquire(priority=0, wait_s=0.01, holder="b")
    assert rejected.value.reason == "wait_timeout"
    assert (await gate.snapshot()).waiting == 0
    await held.release()
    assert (await gate.snapshot()).busy == {held.node.id: None}


async def test_zero_wait_budget_rejects_without_queueing(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    await gate.acquire(priority=0, wait_s=1, holder="a")
    with pytest.raises(GateRejected):
        await gate.acquire(priority=0, wait_s=0, holder="b")
    assert (await gate.snapshot()).waiting == 0


async def test_cancelled_waiter_never_keeps_a_slot(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    waiter.cancel()
    await eventually(waiter.done)
    await held.release()
    assert (await gate.snapshot()).busy == {held.node.id: None}
    again = await gate.acquire(priority=0, wait_s=0, holder="c")
    assert again.node == held.node


async def test_waiter_cancelled_after_being_handed_a_node_passes_it_on(gate_of: MakeGate) -> None:
    """The race between a handoff and the waiter's cancellation must not lose the node."""
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    for _ in range(10):
        first = asyncio.create_task(gate.acquire(priority=1, wait_s=60, holder="b"))
        second = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="c"))
        await waiting(gate, 2)
        await held.release()  # hands the node to `first`...
        if not first.done():
            break
        # A shared backend's waiter can claim its node before this task resumes: the race
        # was not set up this time (never on memory). Serve both and set it up again.
        await first.result().release()
        held = await second
    else:
        # The backend hands the node over within the release (Redis, to a waiter of the
        # releasing replica): the waiter has run before this task resumes. The race is set
        # up there by test_redis_gate.py's
        # test_a_waiter_cancelled_as_its_node_is_handed_over_passes_it_on.
        assert (await gate.snapshot()).busy == {held.node.id: "c"}
        return
    first.cancel()  # ...which is cancelled before it could run
    await eventually(second.done)
    assert first.cancelled()
    assert (await gate.snapshot()).busy == {held.node.id: "c"}


async def test_release_is_idempotent(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    await lease.release()
    await lease.release()
    a = await gate.acquire(priority=0, wait_s=0, holder="b")
    with pytest.raises(GateRejected):
        await gate.acquire(priority=0, wait_s=0, holder="c")
    assert a.released is False


async def test_retry_after_grows_with_the_queue(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=100)
    await gate.acquire(priority=0, wait_s=1, holder="a")
    empty = await gate.retry_after_s()
    waiters = [
        asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder=str(i))) for i in range(20)
    ]
    await waiting(gate, 20)
    assert await gate.retry_after_s() > empty
    for w in waiters:
        w.cancel()


async def test_a_waiter_cancelled_in_the_same_turn_as_a_release_loses_no_node(
    gate_of: MakeGate,
) -> None:
    """The waiter's future is cancelled before its task has run its cleanup; a release in
    that window must pass the node on, not try to hand it to the cancelled waiter."""
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    waiter.cancel()
    await held.release()  # same turn: the waiter's task has not resumed yet
    await eventually(waiter.done)
    assert waiter.cancelled()
    assert (await gate.snapshot()).waiting == 0
    again = await gate.acquire(priority=0, wait_s=0, holder="c")
    assert again.node == held.node


async def test_a_reload_adds_nodes_at_once_and_lets_removed_ones_finish(
    gate_of: MakeGate,
) -> None:
    first, second, third = nodes(3)
    gate = gate_of([first, second], max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    other = second if held.node == first else first
    await gate.acquire(priority=0, wait_s=1, holder="b")  # both held now
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=5, holder="w"))
    await waiting(gate, 1)
    await gate.set_nodes([other, third])  # the held `held.node` leaves; `third` joins
    assert (await waiter).node == third, "a new node serves the queue at once"
    snapshot = await gate.snapshot()
    assert set(snapshot.busy) == {first.id, second.id, third.id}, "the leaving node finishes"
    await held.release()
    snapshot = await gate.snapshot()
    assert set(snapshot.busy) == {other.id, third.id}, "then it is gone"
    with pytest.raises(GateRejected):
        await gate.acquire(priority=0, wait_s=0, holder="c")
    assert held.node not in await gate.nodes()


async def test_the_expected_wait_is_none_with_a_node_free_and_grows_with_the_queue(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    assert await gate.expected_wait_s() == 0.0
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    alone = await gate.expected_wait_s()
    assert alone > 0.0
    queued = asyncio.create_task(gate.acquire(priority=0, wait_s=5, holder="b"))
    await waiting(gate, 1)
    assert await gate.expected_wait_s() > alone  # a turn more
    await held.release()
    await (await queued).release()
    assert await gate.expected_wait_s() == 0.0
