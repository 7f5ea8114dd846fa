"""Node health: the circuit breaker, and how every gate backend routes around out nodes."""

from __future__ import annotations

import asyncio

import pytest

from router.gate import GateRejected, NodeFailure, failure_for
from router.gate.circuit_breaker import NodeHealth
from tests.gate.conftest import MakeGate, nodes, waiting

HARD = NodeFailure("node_unreachable", hard=True)
SOFT = NodeFailure("decode_truncated", hard=False)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("node_unreachable", HARD),
        ("node_busy", NodeFailure("node_busy", hard=True)),
        ("decode_stalled", NodeFailure("decode_stalled", hard=False)),
        ("kv_transfer_timeout", NodeFailure("kv_transfer_timeout", hard=False)),
        ("prefill_failed", None),
        (None, None),
    ],
)
def test_which_errors_count_against_a_node(code: str | None, expected: NodeFailure | None) -> None:
    assert failure_for(code) == expected


def test_hard_failure_trips_at_once_soft_after_the_threshold() -> None:
    health = NodeHealth(["a", "b"], threshold=3, cooldown_s=5)
    assert health.record("a", HARD) is True
    assert health.out() == {"a": "node_unreachable"}
    assert [health.record("b", SOFT) for _ in range(3)] == [False, False, True]
    assert health.in_service == 0


def test_a_success_resets_the_count() -> None:
    health = NodeHealth(["a"], threshold=2, cooldown_s=5)
    health.record("a", SOFT)
    health.record("a", None)
    assert health.record("a", SOFT) is False
    assert health.out() == {}


def test_probing_waits_for_the_cool_down() -> None:
    clock = Clock()
    health = NodeHealth(["a"], threshold=1, cooldown_s=5, clock=clock)
    health.record("a", SOFT)
    assert health.due_for_probe() == []
    clock.now += 5
    assert health.due_for_probe() == ["a"]
    assert health.readmit("a") is True
    assert health.due_for_probe() == [] and health.out() == {}


async def test_an_out_node_is_not_granted_until_readmitted(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=4, failure_threshold=1, cooldown_s=0)
    first = await gate.acquire(priority=0, wait_s=1, holder="a")
    await first.release(HARD)
    for _ in range(3):
        lease = await gate.acquire(priority=0, wait_s=1, holder="b")
        assert lease.node != first.node
        await lease.release()
    assert (await gate.snapshot()).out == {first.node.id: "node_unreachable"}
    assert [n.id for n in await gate.due_for_probe()] == [first.node.id]
    await gate.readmit(first.node.id)
    a = await gate.acquire(priority=0, wait_s=0, holder="c")
    b = await gate.acquire(priority=0, wait_s=0, holder="d")
    assert {a.node.id, b.node.id} == {n.id for n in nodes(2)}


async def test_with_every_node_out_requests_are_rejected_not_queued(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4, failure_threshold=1, cooldown_s=0)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    await lease.release(HARD)
    with pytest.raises(GateRejected) as queued:
        await waiter
    assert queued.value.reason == "no_node"
    with pytest.raises(GateRejected) as fresh:
        await gate.acquire(priority=0, wait_s=60, holder="c")
    assert fresh.value.reason == "no_node"
    assert (await gate.snapshot()).waiting == 0


async def test_readmitting_a_node_serves_a_waiter(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=4, failure_threshold=1, cooldown_s=0)
    a = await gate.acquire(priority=0, wait_s=1, holder="a")
    b = await gate.acquire(priority=0, wait_s=1, holder="b")
    await a.release(SOFT)
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="c"))
    await waiting(gate, 1)
    assert not waiter.done()
    await gate.readmit(a.node.id)
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.node == a.node
    await b.release()


async def test_with_no_node_in_service_retry_after_follows_the_probe_cool_down(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=4, failure_threshold=1, cooldown_s=7)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    await lease.release(HARD)
    assert 7 <= await gate.retry_after_s() <= 8


async def test_a_drained_node_finishes_its_request_and_takes_no_more(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=4, failure_threshold=1, cooldown_s=0)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    assert await gate.drain(held.node.id)
    other = await gate.acquire(priority=0, wait_s=0, holder="c")  # the free node is still used
    assert other.node != held.node
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    await held.release()
    snapshot = await gate.snapshot()
    assert not waiter.done() and snapshot.waiting == 1, "the drained node went to no one"
    assert snapshot.busy[held.node.id] is None
    assert snapshot.out == {held.node.id: "drained"}
    assert await gate.due_for_probe() == [], "the prober never undoes a drain"
    assert await gate.undrain(held.node.id)
    assert (await asyncio.wait_for(waiter, 5)).node == held.node
    assert (await gate.snapshot()).out == {}


async def test_draining_every_node_sheds_the_queue(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    await gate.drain(held.node.id)
    with pytest.raises(GateRejected) as shed:
        await waiter
    assert shed.value.reason == "no_node"
    assert not await gate.drain("nowhere:1")


async def test_a_node_reserved_for_a_waiter_is_not_taken_out_from_under_it(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=4)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    await held.release()  # handed (reserved) to the waiter, whose task has not run yet
    await gate.take_out(held.node.id, "not_ready_at_start")
    lease = await asyncio.wait_for(waiter, 5)
    assert lease.node == held.node
    assert (await gate.snapshot()).out == {}


async def test_only_an_out_node_can_be_claimed_for_a_flush(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=4, failure_threshold=1, cooldown_s=0)
    held = await gate.acquire(priority=0, wait_s=1, holder="a")
    free = next(n for n in nodes(2) if n != held.node)
    assert await gate.claim_for_probe(free.id, for_s=30) is None  # in service
    assert await gate.claim_for_probe(held.node.id, for_s=30) is None  # held
    await held.release(HARD)
    assert await gate.claim_for_probe(held.node.id, for_s=30) is not None
    await gate.drain(free.id)
    assert await gate.claim_for_probe(free.id, for_s=30) is None  # an operator's drain
    await gate.readmit(held.node.id)
    assert (await gate.snapshot()).out == {free.id: "drained"}


MISMATCH = "tilert_version_mismatch: node runs 0.1.5, pool is 0.1.6"
UNFINISHED = NodeFailure("decode_unfinished", hard=True)


async def test_a_node_retired_while_held_serves_only_its_holder_then_goes_out(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(2), max_queue=4)
    retired = await gate.acquire(priority=0, wait_s=1, holder="a")
    other = await gate.acquire(priority=0, wait_s=1, holder="b")
    await gate.retire(retired.node.id, MISMATCH)
    snapshot = await gate.snapshot()
    assert snapshot.out == {retired.node.id: MISMATCH}
    assert snapshot.busy[retired.node.id] == "a"
    assert await retired.renew(), "its holder finishes its request"
    assert await gate.claim_for_probe(retired.node.id, for_s=30) is None  # held: no flush
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="c"))
    await waiting(gate, 1)
    await retired.release()
    snapshot = await gate.snapshot()
    assert not waiter.done() and snapshot.waiting == 1, "the retired node went to no one"
    assert snapshot.out == {retired.node.id: MISMATCH}
    await other.release()
    assert (await asyncio.wait_for(waiter, 5)).node == other.node
    assert await gate.claim_for_probe(retired.node.id, for_s=30) is not None


async def test_retiring_a_node_already_out_replaces_its_reason(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(2), max_queue=4)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    await lease.release(UNFINISHED)
    assert (await gate.snapshot()).out == {lease.node.id: "decode_unfinished"}
    await gate.retire(lease.node.id, MISMATCH)
    assert (await gate.snapshot()).out == {lease.node.id: MISMATCH}


async def test_waiters_wait_while_every_node_is_out_only_to_be_flushed(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=4, cooldown_s=0)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    queued = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    await lease.release(UNFINISHED)
    fresh = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="c"))
    await waiting(gate, 2)
    assert not queued.done() and not fresh.done()
    assert await gate.claim_for_probe(lease.node.id, for_s=30)
    await gate.readmit(lease.node.id)  # flushed and idle
    first = await asyncio.wait_for(queued, 5)
    assert first.node == lease.node
    await first.release()
    await (await asyncio.wait_for(fresh, 5)).release()


async def test_a_lasting_reason_ends_the_wait_for_a_node_out_to_be_flushed(
    gate_of: MakeGate,
) -> None:
    gate = gate_of(nodes(1), max_queue=4, cooldown_s=0)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    await lease.release(UNFINISHED)
    waiter = asyncio.create_task(gate.acquire(priority=0, wait_s=60, holder="b"))
    await waiting(gate, 1)
    await gate.retire(lease.node.id, MISMATCH)
    with pytest.raises(GateRejected) as shed:
        await asyncio.wait_for(waiter, 5)
    assert shed.value.reason == "no_node"
    with pytest.raises(GateRejected) as fresh:
        await gate.acquire(priority=0, wait_s=60, holder="c")
    assert fresh.value.reason == "no_node"


async def test_a_probe_claim_given_back_can_be_taken_again(gate_of: MakeGate) -> None:
    gate = gate_of(nodes(1), max_queue=4, cooldown_s=0)
    lease = await gate.acquire(priority=0, wait_s=1, holder="a")
    await lease.release(UNFINISHED)
    assert await gate.claim_for_probe(lease.node.id, for_s=60) is not None
    await gate.release_probe_claim(lease.node.id)
    assert await gate.claim_for_probe(lease.node.id, for_s=60) is not None
    await gate.readmit(lease.node.id)
    assert (await gate.snapshot()).out == {}
