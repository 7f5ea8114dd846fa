"""The node's receive slot as TileRT 0.1.5 and 0.1.6 keep it (no sockets)."""

import asyncio

from sim.tilert.slot import CANCELLED, Admission, ReceiveSlot, Refusal, Transfer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _slot(
    protocol: str = "0.1.6",
    ranks: frozenset[int] = frozenset({0}),
    clock: Clock | None = None,
    corruptions: list[tuple[str, str, str]] | None = None,
) -> ReceiveSlot:
    sink = corruptions if corruptions is not None else []
    return ReceiveSlot(
        ranks,
        max_seq_len=1000,
        request_timeout_s=120,
        clock=clock or Clock(),
        protocol=protocol,  # type: ignore[arg-type]
        on_corruption=lambda *event: sink.append(event),
    )


def _request(rid: str, rank: int = 0, **extra: object) -> dict[str, object]:
    return {"rid": rid, "rank": rank, "seq_len": 10, "last_prompt_token": 1, **extra}


def _admit(slot: ReceiveSlot, rid: str, rank: int = 0, **extra: object) -> Transfer:
    admission = slot.admit(_request(rid, rank, **extra))
    assert isinstance(admission, Admission), admission
    return admission.transfer


def _refusal(slot: ReceiveSlot, rid: str, rank: int = 0) -> dict[str, object]:
    refusal = slot.admit(_request(rid, rank))
    assert isinstance(refusal, Refusal), refusal
    return refusal.message


def test_busy_refusals_in_each_version_shape() -> None:
    old, new = _slot("0.1.5"), _slot("0.1.6")
    _admit(old, "a")
    _admit(new, "a")
    assert _refusal(old, "b") == {"error": "busy", "busy_rid": "a"}
    assert _refusal(new, "b") == {
        "accepted": False,
        "error": "busy",
        "busy_rid": "a",
        "busy_state": "transferring",
    }


def test_seq_len_refusals() -> None:
    assert _slot("0.1.5").seq_len_refusal("a", 1001) is not None
    refusal = _slot("0.1.6").seq_len_refusal("a", 1001)
    assert refusal is not None
    assert refusal.message == {
        "accepted": False,
        "error": "seq_len exceeds max_seq_len",
        "rid": "a",
        "max_seq_len": 1000,
    }
    assert _slot().seq_len_refusal("a", 1000) is None


def test_completion_needs_every_rank() -> None:
    slot = _slot(ranks=frozenset({0, 1}))
    a0 = _admit(slot, "a", 0)
    a1 = _admit(slot, "a", 1)
    assert a0 is a1
    assert not slot.done(a0, 0)
    assert _refusal(slot, "a", 0)["error"] == "duplicate_rank"
    assert slot.done(a1, 1)
    assert [t.rid for t in slot.queue] == ["a"]


def test_a_timed_out_transfer_no_longer_blocks() -> None:
    clock = Clock()
    slot = _slot(clock=clock)
    _admit(slot, "a")
    slot.writer_left(slot.current)  # type: ignore[arg-type]  # the sender is gone
    assert _refusal(slot, "b")["error"] == "busy"  # transferring, no done: still held
    clock.now += 120
    assert _admit(slot, "b").rid == "b"


def test_v15_release_erases_whatever_the_slot_holds() -> None:
    slot = _slot("0.1.5")
    a = _admit(slot, "a")
    slot.release("someone-else")
    assert slot.current is None
    assert not slot.done(a, 0)  # a's done is ignored: its transfer is gone


def test_v16_release_frees_only_its_own_rid_and_tombstones_it() -> None:
    slot = _slot("0.1.6")
    a = _admit(slot, "a")
    slot.release("b")
    assert slot.current is a
    slot.release("a")  # a sender is still writing: cancelling until it leaves
    assert a.state == "cancelling"
    no_consumer = {"accepted": False, "error": "cancelling", "rid": "a", "detail": "no_consumer"}
    assert _refusal(slot, "a") == no_consumer  # tombstoned
    slot.expect("a")  # a new /pd/decode for it drops the tombstone
    assert _refusal(slot, "a") == {"accepted": False, "error": "cancelling", "rid": "a"}
    slot.writer_left(a)
    assert slot.current is None
    assert _admit(slot, "a").rid == "a"


def test_admitting_over_a_complete_transfer_is_corruption() -> None:
    for protocol in ("0.1.5", "0.1.6"):
        events: list[tuple[str, str, str]] = []
        slot = _slot(protocol, corruptions=events)
        a = _admit(slot, "a")
        assert slot.done(a, 0)
        b = _admit(slot, "b")  # a complete transfer counts as free
        assert b.rid == "b"
        assert events == [("b", "a", "overwrote_complete")]
        assert a.overwritten_by == "b"


def test_a_refused_write_is_corruption_in_either_order() -> None:
    events: list[tuple[str, str, str]] = []
    slot = _slot("0.1.5", corruptions=events)
    _admit(slot, "a")
    _refusal(slot, "b")
    slot.put_plan("b", [1, 2])
    slot.put_plan("c", [3])
    _refusal(slot, "c")
    assert events == [("b", "a", "write_while_busy"), ("c", "a", "write_while_busy")]


async def test_the_completed_queue_wakes_waiters_and_cancel_ends_the_wait() -> None:
    slot = _slot()
    a = _admit(slot, "a")
    waiter = asyncio.create_task(slot.next_completed(30, asyncio.Event()))
    await asyncio.sleep(0)
    slot.done(a, 0)
    assert await waiter is a
    cancelled = asyncio.Event()
    cancelled.set()
    assert await slot.next_completed(30, cancelled) is CANCELLED
    assert await slot.next_completed(0, None) is None


def test_records_can_be_read_once_tombstones_expire() -> None:
    clock = Clock()
    slot = _slot("0.1.6", clock=clock)
    for rid in ("a", "b"):
        slot.release(rid)
    assert slot.snapshot()["tombstones"] == ["a", "b"]
    clock.now += 60
    slot.release("c")
    # A retried admission of "a" with a longer window keeps its tombstone longer.
    assert isinstance(slot.admit(_request("a", admission_window_s=300)), Refusal)
    clock.now += 61  # "b"'s tombstone is over, "c"'s and "a"'s are not
    assert slot.snapshot()["tombstones"] == ["a", "c"]
    clock.now += 1000
    assert slot.snapshot()["tombstones"] == []
