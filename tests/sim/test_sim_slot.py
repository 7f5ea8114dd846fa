"""The node's receive slot: one transfer at a time, completion by rank, stale transfers."""

import asyncio

from sim.tilert.slot import ReceiveSlot


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _slot(ranks: frozenset[int] = frozenset({0}), clock: Clock | None = None) -> ReceiveSlot:
    return ReceiveSlot(ranks, max_seq_len=1000, request_timeout_s=120, clock=clock or Clock())


def test_second_rid_is_refused_while_the_first_is_in_progress() -> None:
    slot = _slot()
    assert slot.open("a", 0, 10, 1, None) is None
    refusal = slot.open("b", 0, 10, 1, None)
    assert refusal is not None
    assert refusal.message == {"error": "busy", "busy_rid": "a"}


def test_seq_len_over_the_limit_is_refused() -> None:
    refusal = _slot().open("a", 0, 1001, 1, None)
    assert refusal is not None
    assert refusal.message == {"error": "seq_len exceeds max_seq_len"}


def test_completion_needs_every_rank_and_frees_the_slot() -> None:
    slot = _slot(frozenset({0, 1}))
    assert slot.open("a", 0, 10, 1, None) is None
    assert slot.open("a", 1, 10, 1, None) is None
    assert not slot.done("a", 0)
    assert slot.open("b", 0, 10, 1, None) is not None
    assert slot.done("a", 1)
    assert "a" in slot.completed
    assert slot.open("b", 0, 10, 1, None) is None


def test_a_timed_out_transfer_no_longer_blocks() -> None:
    clock = Clock()
    slot = _slot(clock=clock)
    slot.open("a", 0, 10, 1, None)
    clock.now += 120
    assert slot.open("b", 0, 10, 1, None) is None
    assert slot.in_progress is not None and slot.in_progress.rid == "b"


def test_plans_and_stale_transfers() -> None:
    slot = _slot()
    for rid in ("a", "b"):
        slot.put_plan(rid, [1, 2, 3])
        slot.open(rid, 0, 10, 1, None)
        slot.done(rid, 0)
    assert slot.drop_stale("b") == ["a"]
    transfer, plan = slot.take("b")
    assert (transfer.rid, plan) == ("b", [1, 2, 3])
    assert slot.completed == {}


async def test_waiting_for_a_transfer_wakes_on_completion() -> None:
    slot = _slot()
    slot.open("a", 0, 10, 1, None)
    waiter = asyncio.create_task(slot.wait_complete("a", 30, asyncio.Event()))
    await asyncio.sleep(0)
    slot.done("a", 0)
    assert await waiter


async def test_waiting_ends_on_cancel_or_timeout() -> None:
    slot = _slot()
    cancelled = asyncio.Event()
    cancelled.set()
    assert not await slot.wait_complete("a", 30, cancelled)
    assert not await slot.wait_complete("a", 0, asyncio.Event())
