"""Passive outlier ejection, on a fake clock."""

from __future__ import annotations

import pytest

from router.errors import DecodeError, PrefillError, UpstreamError
from router.selection import EjectionPolicy, HealthBook, outcome_of, status_outcome

A, B, C, D = "http://a", "http://b", "http://c", "http://d"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def book_of(*urls: str, **policy: float) -> tuple[HealthBook, Clock]:
    clock = Clock()
    return HealthBook(urls, EjectionPolicy(**policy), clock=clock), clock  # type: ignore[arg-type]


def fail(book: HealthBook, url: str, times: int, outcome: str = "unreachable") -> None:
    for _ in range(times):
        book.report(url, outcome)  # type: ignore[arg-type]


def test_five_failures_in_a_row_eject_for_ten_seconds() -> None:
    book, clock = book_of(A, B)
    fail(book, A, 4)
    assert book.state(A) == "failing" and book.eligible(A)
    fail(book, A, 1)
    assert book.state(A) == "ejected" and not book.eligible(A)
    clock.now += 9.999
    assert not book.eligible(A)
    clock.now += 0.001
    assert book.eligible(A) and book.state(A) == "probation"


def test_a_success_between_failures_resets_the_count() -> None:
    book, _ = book_of(A, B)
    fail(book, A, 4, "timeout")
    book.report(A, "ok")
    fail(book, A, 4, "error")
    assert book.eligible(A) and book.state(A) == "failing"


def test_on_probation_one_failure_ejects_again_for_twice_as_long_up_to_the_cap() -> None:
    book, clock = book_of(A, B, max_ejection_s=35.0)
    fail(book, A, 5)
    lengths = []
    for _ in range(4):
        until = clock.now
        while not book.eligible(A):
            clock.now += 1.0
        lengths.append(clock.now - until)
        fail(book, A, 1)
    assert lengths == [10.0, 20.0, 35.0, 35.0]
    assert book.snapshot()[A]["ejections"] == 5


def test_a_success_on_probation_readmits_fully() -> None:
    book, clock = book_of(A, B)
    fail(book, A, 5)
    clock.now += 10
    book.report(A, "ok")
    assert book.state(A) == "healthy"
    fail(book, A, 4)
    assert book.eligible(A)
    fail(book, A, 1)
    clock.now += 10  # the back-off starts over at its base
    assert book.eligible(A)


def test_at_most_half_the_set_is_ejected() -> None:
    book, _ = book_of(A, B, C, D)
    for url in (A, B, C):
        fail(book, url, 5)
    assert [book.eligible(url) for url in (A, B, C, D)] == [False, False, True, True]
    assert book.state(C) == "failing"


def test_the_last_server_is_never_ejected() -> None:
    book, _ = book_of(A, max_ejected_share=1.0)
    fail(book, A, 50)
    assert book.eligible(A)
    pair, _ = book_of(A, B, max_ejected_share=1.0)
    fail(pair, A, 5)
    fail(pair, B, 5)
    assert [pair.eligible(A), pair.eligible(B)] == [False, True]


def test_a_server_refused_ejection_is_ejected_once_room_is_made() -> None:
    book, clock = book_of(A, B)
    fail(book, A, 5)
    fail(book, B, 5)
    assert book.eligible(B) and not book.eligible(A)
    clock.now += 10
    book.report(A, "ok")
    fail(book, B, 1)
    assert not book.eligible(B)


def test_a_probe_readmits_before_the_back_off_ends() -> None:
    book, _ = book_of(A, B)
    fail(book, A, 5)
    book.readmit(A)
    assert book.eligible(A) and book.state(A) == "probation"


def test_an_unknown_url_is_ignored() -> None:
    book, _ = book_of(A)
    book.report("http://elsewhere", "error")
    assert list(book.snapshot()) == [A]


def test_a_book_that_replaces_another_keeps_the_record_of_the_servers_both_hold() -> None:
    old, clock = book_of(A, B, C)
    fail(old, A, 5)
    fail(old, B, 2, "timeout")
    new = HealthBook([A, B, D], clock=clock)
    new.adopt(old)
    assert new.state(A) == "ejected" and not new.eligible(A)
    assert new.snapshot()[B]["consecutive_failures"] == 2
    assert new.snapshot()[D] == HealthBook([D]).snapshot()[D]  # a new server: fresh
    old.report(B, "error")  # a call still in flight in the replaced set
    assert new.snapshot()[B]["consecutive_failures"] == 3
    clock.now += 10  # the back-off goes on where it was: on probation, one failure ejects
    fail(new, A, 1)
    assert new.state(A) == "ejected" and new.snapshot()[A]["ejected_for_s"] == 20.0


def test_a_server_dropped_by_one_book_starts_fresh_in_the_next_that_holds_it() -> None:
    first, clock = book_of(A, B, C, D)
    fail(first, A, 5)
    fail(first, B, 5)
    second = HealthBook([A, C, D], clock=clock)  # B removed
    second.adopt(first)
    third = HealthBook([A, B, C, D], clock=clock)  # and added back
    third.adopt(second)
    assert third.state(A) == "ejected"
    assert third.state(B) == "healthy" and third.snapshot()[B]["failures"] == 0


def test_ejections_are_announced() -> None:
    ejected: list[str] = []
    book = HealthBook([A, B], clock=Clock(), on_ejected=ejected.append)
    fail(book, A, 5)
    assert ejected == [A]


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (PrefillError("x", code="prefill_unreachable"), "unreachable"),
        (UpstreamError("x", code="decode_unreachable"), "unreachable"),
        (PrefillError("x", code="prefill_timeout", status=504, in_doubt=True), "timeout"),
        (PrefillError("x", code="prefill_failed", status=502, in_doubt=True), "error"),
        (UpstreamError("x", code="decode_failed", status=503), "error"),
        (UpstreamError("x", code="decode_failed", status=400), "ok"),
        (DecodeError("x", code="node_busy", status=429), "ok"),
    ],
)
def test_what_an_error_says_about_its_server(error: UpstreamError, outcome: str) -> None:
    assert outcome_of(error) == outcome


def test_errors_not_about_a_server_say_nothing() -> None:
    assert outcome_of(ValueError()) is None
    assert status_outcome(500) == "error" and status_outcome(404) == "ok"
