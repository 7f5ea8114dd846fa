"""The fault board: arming, counts, validation."""

import pytest

from sim.faults import FaultBoard, FaultError

SCHEMA = {"stall": bool, "die_after": int, "slow_ms": float}


def test_permanent_fault_stays_armed() -> None:
    board = FaultBoard(SCHEMA)
    board.arm({"stall": True})
    assert [board.take("stall", bool) for _ in range(3)] == [True, True, True]


def test_counted_fault_clears_after_its_uses() -> None:
    board = FaultBoard(SCHEMA)
    board.arm({"die_after": 0, "slow_ms": 5}, count=2)
    assert board.take("die_after", int) == 0
    assert board.take("die_after", int) == 0
    assert board.take("die_after", int) is None
    assert board.snapshot() == {"slow_ms": {"value": 5.0, "remaining": 2}}


def test_peek_does_not_use_up_and_false_disarms() -> None:
    board = FaultBoard(SCHEMA)
    board.arm({"stall": True}, count=1)
    assert board.peek("stall", bool) is True
    board.arm({"stall": False})
    assert board.take("stall", bool) is None


@pytest.mark.parametrize(
    ("values", "count"),
    [
        ({"nope": True}, None),
        ({"die_after": "3"}, None),
        ({"die_after": True}, None),
        ({"stall": True}, 0),
        ({"stall": True}, True),
        ({"stall": True}, 1.5),
    ],
)
def test_bad_requests_are_rejected(values: dict, count: object) -> None:
    board = FaultBoard(SCHEMA)
    with pytest.raises(FaultError):
        board.arm(values, count)
    assert board.snapshot() == {}


def test_clear_disarms_everything() -> None:
    board = FaultBoard(SCHEMA)
    board.arm({"stall": True, "die_after": 1})
    board.clear()
    assert board.snapshot() == {}


def test_a_fault_is_read_as_the_type_its_schema_gives() -> None:
    board = FaultBoard(SCHEMA)
    board.arm({"slow_ms": 5, "stall": True})
    assert board.take("slow_ms", float) == 5.0
    with pytest.raises(TypeError):
        board.take("stall", int)
    with pytest.raises(TypeError):
        board.peek("nope", bool)
