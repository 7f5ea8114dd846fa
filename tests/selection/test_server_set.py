"""The choice among equivalent servers: filters, scorers, the picker, and the reasons."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from router.selection import (
    Affinity,
    Choice,
    HealthBook,
    Load,
    LoadBook,
    PrefixAffinity,
    ServerLoad,
    ServerSet,
    SessionAffinity,
    default_set,
    load_snapshot,
)
from router.selection.affinity import block_hashes

A, B, C, D = "http://a:8000", "http://b:8000", "http://c:8000", "http://d:8000"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_empty_set_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ServerSet([])


def test_a_set_of_one_says_so() -> None:
    assert default_set([A]).pick() == Choice(A, "only_server")


def test_ties_rotate_and_say_so() -> None:
    servers = default_set([A, B, C])
    picks = [servers.pick() for _ in range(6)]
    assert [p.url for p in picks] == [A, B, C, A, B, C]
    assert {p.reason for p in picks} == {"rotation"}


def test_the_least_busy_wins_by_load() -> None:
    servers = default_set([A, B, C])
    with servers.hold(A), servers.hold(B), servers.hold(B):
        assert servers.pick() == Choice(C, "load")
        with servers.hold(C), servers.hold(C):
            assert servers.pick() == Choice(A, "load")
    assert servers.outstanding() == {A: 0, B: 0, C: 0}


def test_the_healthy_filter_leaving_one_server_names_itself() -> None:
    clock = Clock()
    book = HealthBook([A, B], clock=clock)
    servers = default_set([A, B], health=book)
    for _ in range(5):
        servers.report(A, "unreachable")
    assert [servers.pick() for _ in range(3)] == [Choice(B, "only_healthy")] * 3


def test_a_retry_excludes_the_failed_server_unless_nothing_is_left() -> None:
    servers = default_set([A, B])
    assert servers.pick(exclude=[A]) == Choice(B, "retry_only_other")
    assert default_set([A, B, C]).pick(exclude=[A]) == Choice(B, "retry_rotation")
    assert servers.pick(exclude=[A, B]).url in (A, B)


class Weighted:
    """A scorer that prefers servers by a fixed rank."""

    def __init__(self, name: str, rank: Mapping[str, float], weight: float = 1.0) -> None:
        self.name, self._rank, self.weight = name, rank, weight

    def score(self, url: str, load: Mapping[str, float], in_flight: Mapping[str, int]) -> float:
        return self._rank[url]


class Named:
    def __init__(self, name: str, kept: set[str]) -> None:
        self.name, self._kept = name, kept

    def keep(self, url: str) -> bool:
        return url in self._kept


def test_the_scorer_that_separated_the_winner_is_the_reason() -> None:
    servers = ServerSet(
        [A, B, C],
        scorers=[
            Weighted("cache", {A: 0, B: 1, C: 1}, weight=2),
            Weighted("zone", {A: 1, B: 0, C: 1}),
        ],
    )
    assert servers.pick() == Choice(A, "cache")


def test_filters_apply_in_order_and_one_that_leaves_nothing_is_ignored() -> None:
    servers = ServerSet([A, B, C], filters=[Named("zone", set()), Named("warm", {B})])
    assert servers.pick() == Choice(B, "none_zone_only_warm")


def test_the_snapshot_shows_load_and_health() -> None:
    servers = default_set([A, B])
    servers.report(A, "timeout")
    with servers.hold(B):
        snapshot = servers.snapshot()
    assert snapshot[A]["state"] == "failing"
    assert snapshot[A]["consecutive_failures"] == 1
    assert snapshot[B]["outstanding"] == 1


def learning_set(urls: list[str], clock: Clock) -> ServerSet:
    """The default set with what it learns: health, load figures, a prefix index."""
    return default_set(
        urls,
        health=HealthBook(urls, clock=clock),
        load=LoadBook(clock=clock),
        request_scorers=[PrefixAffinity(), SessionAffinity()],
    )


def test_a_set_that_replaces_another_takes_over_what_it_learned_of_the_servers_both_name() -> None:
    clock = Clock()
    old = learning_set([A, B, C], clock)
    for _ in range(5):
        old.report(A, "unreachable")
    load_book(old).record(B, Load(running=4, waiting=4, kv_cache_usage=1.0), valid_s=6)
    prompt = Affinity(block_hashes(list(range(64))), tokens=64)
    with old.hold(C, prompt):
        pass
    new = learning_set([A, B, C, D], clock)
    new.adopt(old)
    assert new.snapshot()[A]["state"] == "ejected"
    assert load_snapshot(new)[B]["waiting"] == 4
    # D, which the old set did not name, starts fresh.
    assert new.snapshot()[D] == {"outstanding": 0, **HealthBook([D]).snapshot()[D]}
    assert D not in load_snapshot(new)
    # The request goes where its prefix is, never to the ejected server nor the busy one.
    assert new.pick(request=prompt) == Choice(C, "prefix:4 blocks")
    assert {new.pick().url for _ in range(6)} == {C, D}


def test_a_server_a_set_dropped_starts_fresh_when_the_next_names_it_again() -> None:
    clock = Clock()
    first = learning_set([A, B, C, D], clock)
    for url in (A, B):
        for _ in range(5):
            first.report(url, "unreachable")
    second = learning_set([A, C, D], clock)
    second.adopt(first)
    third = learning_set([A, B, C, D], clock)
    third.adopt(second)
    assert third.snapshot()[A]["state"] == "ejected"
    assert third.snapshot()[B]["state"] == "healthy" and third.snapshot()[B]["failures"] == 0


def load_book(servers: ServerSet) -> LoadBook:
    (book,) = [s.book for s in servers.scorers if isinstance(s, ServerLoad)]
    return book


def test_a_choice_made_earlier_stands_only_while_its_server_is_still_healthy() -> None:
    book = HealthBook([A, B, C])
    servers = default_set([A, B, C], health=book)
    made = Choice(A, "load")
    assert servers.still(made) is made
    for _ in range(5):  # ejected meanwhile (during a wait for a node, say)
        book.report(A, "unreachable")
    assert servers.still(made) is None
    assert servers.still(Choice("http://elsewhere", "load")) is None
    assert servers.still(None) is None
