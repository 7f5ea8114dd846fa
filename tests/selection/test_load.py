"""Each server's own load: read from its /metrics, held for a few intervals, ranked by."""

from __future__ import annotations

import asyncio

import pytest

from router.errors import UpstreamError
from router.selection import (
    HealthBook,
    Load,
    LoadBook,
    ServerLoad,
    ServerSet,
    default_set,
    load_snapshot,
    parse_load,
    scrape_forever,
    scrape_once,
)

A, B = "http://a", "http://b"

# As vLLM 0.32 (and the simulator) write it: labels sorted, HELP and TYPE lines, histograms.
PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="tiny"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 4.0
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_three_figures_are_read_from_a_vllm_page() -> None:
    assert parse_load(PAGE) == Load(running=3.0, waiting=5.0, kv_cache_usage=0.25)


def test_engines_add_their_queues_and_the_fullest_cache_counts() -> None:
    page = "\n".join(
        f'{name}{{engine="{engine}",model_name="m"}} {value}'
        for engine, (running, waiting, kv) in enumerate([(1, 2, 0.5), (3, 4, 0.75)])
        for name, value in (
            ("vllm:num_requests_running", running),
            ("vllm:num_requests_waiting", waiting),
            ("vllm:kv_cache_usage_perc", kv),
        )
    )
    assert parse_load(page) == Load(running=4.0, waiting=6.0, kv_cache_usage=0.75)


@pytest.mark.parametrize(
    "page",
    [
        "",
        "# TYPE other gauge\nother 1\n",
        "vllm:num_requests_running{engine= 3\n",  # not Prometheus text
        "<html>not metrics</html>",
    ],
)
def test_a_page_without_the_figures_gives_none(page: str) -> None:
    assert parse_load(page) is None


def test_figures_hold_for_their_validity_and_then_go_stale() -> None:
    clock = Clock()
    book = LoadBook(clock=clock)
    load = Load(running=1, waiting=2, kv_cache_usage=0.5)
    book.record(A, load, valid_s=6)
    clock.now += 6
    assert book.fresh(A) == load
    assert book.snapshot([A, B]) == {
        A: {
            "running": 1,
            "waiting": 2,
            "own_when_read": 0,
            "kv_cache_usage": 0.5,
            "age_s": 6.0,
            "stale": False,
        }
    }
    clock.now += 0.5
    assert book.fresh(A) is None
    assert book.snapshot([A])[A]["stale"] is True
    book.record(A, None, valid_s=6)  # the server no longer reports any
    assert book.fresh(A) is None and book.snapshot([A]) == {}


def test_a_book_that_replaces_another_keeps_the_figures_of_the_servers_it_names() -> None:
    clock = Clock()
    old = LoadBook(clock=clock)
    old.record(A, Load(running=1, waiting=2, kv_cache_usage=0.5), valid_s=6, own=1)
    old.record(B, Load(running=3, waiting=0, kv_cache_usage=0.0), valid_s=6)
    clock.now += 2
    new = LoadBook(clock=clock)
    new.adopt(old, [A, "http://c"])
    assert new.snapshot([A, B]) == {
        A: {
            "running": 1,
            "waiting": 2,
            "own_when_read": 1,
            "kv_cache_usage": 0.5,
            "age_s": 2.0,  # as old as they were
            "stale": False,
        }
    }
    assert new.foreign(A) == 2.0
    clock.now += 4.5
    assert new.fresh(A) is None  # and they go stale when they would have


def test_the_score_weighs_foreign_and_waiting_requests_and_kv_use() -> None:
    book = LoadBook(clock=Clock())
    scorer = ServerLoad(book)
    # 8 requests on the server when read, 2 of them the gateway's own: 6 foreign; 5 waiting.
    book.record(A, Load(running=3, waiting=5, kv_cache_usage=0.25), valid_s=1, own=2)
    assert scorer.name == "queue"
    assert scorer.score(A, {A: 2.0}, {A: 2}) == 6 * 1.0 + 5 * 1.0 + 0.25 * 4.0
    # What the gateway has in flight now does not change what was foreign when read: the
    # requests it counted then may have ended since.
    assert scorer.score(A, {A: 0.0}, {A: 0}) == 6 * 1.0 + 5 * 1.0 + 0.25 * 4.0
    # The gateway's own requests are not counted twice (nor below zero).
    book.record(A, Load(running=3, waiting=5, kv_cache_usage=0.25), valid_s=1, own=9)
    assert scorer.score(A, {A: 9.0}, {A: 9}) == 5 * 1.0 + 0.25 * 4.0
    assert scorer.score(B, {B: 7.0}, {B: 7}) == 0.0  # no figures


def loaded_set(clock: Clock) -> tuple[ServerSet, LoadBook]:
    book = LoadBook(clock=clock)
    return default_set([A, B], health=HealthBook([A, B], clock=clock), load=book), book


def test_a_server_with_a_queue_loses_to_an_idle_one_and_the_reason_is_queue() -> None:
    clock = Clock()
    servers, book = loaded_set(clock)
    book.record(A, Load(running=1, waiting=4, kv_cache_usage=0.1), valid_s=6)
    book.record(B, Load(running=0, waiting=0, kv_cache_usage=0.0), valid_s=6)
    picks = [servers.pick() for _ in range(4)]
    assert {(p.url, p.reason) for p in picks} == {(B, "queue")}


def test_the_gateways_own_requests_still_count_and_decide_as_load() -> None:
    clock = Clock()
    servers, book = loaded_set(clock)
    book.record(A, Load(running=1, waiting=0, kv_cache_usage=0.0), valid_s=6)
    book.record(B, Load(running=1, waiting=0, kv_cache_usage=0.0), valid_s=6)
    with servers.hold(A), servers.hold(A):
        assert servers.pick().url == B
        assert servers.pick().reason == "load"


def test_stale_figures_fall_back_to_requests_in_flight() -> None:
    clock = Clock()
    servers, book = loaded_set(clock)
    book.record(A, Load(running=0, waiting=0, kv_cache_usage=0.0), valid_s=6)
    book.record(B, Load(running=8, waiting=8, kv_cache_usage=1.0), valid_s=6)
    with servers.hold(A):
        assert servers.pick().url == A
        clock.now += 7  # B's queue is no longer known: only A's request in flight counts
        choice = servers.pick()
    assert (choice.url, choice.reason) == (B, "load")
    assert {p.reason for p in (servers.pick(), servers.pick())} == {"rotation"}


class Reader:
    def __init__(self, loads: dict[str, Load | None]) -> None:
        self.loads = loads
        self.asked: list[str] = []

    async def __call__(self, url: str) -> Load | None:
        self.asked.append(url)
        if url not in self.loads:
            raise UpstreamError("the server is unreachable", status=502, code="unreachable")
        return self.loads[url]


async def test_a_server_in_two_sets_is_read_once_and_both_books_hear_it() -> None:
    clock = Clock()
    first, first_book = loaded_set(clock)
    second_book = LoadBook(clock=clock)
    second = default_set([A], load=second_book)
    busy = Load(running=2, waiting=1, kv_cache_usage=0.5)
    reader = Reader({A: busy, B: None})
    assert await scrape_once([first, second], reader, interval_s=2) == {A: busy, B: None}
    assert reader.asked == [A, B]
    assert first_book.fresh(A) == busy == second_book.fresh(A)
    assert first_book.fresh(B) is None
    clock.now += 6  # three intervals
    assert load_snapshot(first)[A]["stale"] is False
    clock.now += 0.1
    assert load_snapshot(first)[A]["stale"] is True


async def test_a_reading_keeps_the_gateways_own_requests_then() -> None:
    """Three requests on the server when read, two of them the gateway's: one is foreign,
    also after the gateway's have ended; and one of the gateway's that ends while the
    server is being read is still its own."""
    clock = Clock()
    servers, book = loaded_set(clock)
    first, second = servers.hold(A), servers.hold(A)
    first.__enter__()
    second.__enter__()

    class EndingDuringTheRead(Reader):
        async def __call__(self, url: str) -> Load | None:
            if url == A:
                second.__exit__(None, None, None)
            return await super().__call__(url)

    three = Load(running=3, waiting=0, kv_cache_usage=0.0)
    await scrape_once([servers], EndingDuringTheRead({A: three, B: None}), interval_s=1)
    first.__exit__(None, None, None)
    assert servers.outstanding() == {A: 0, B: 0}
    assert book.foreign(A) == 1.0
    assert load_snapshot(servers)[A]["own_when_read"] == 2


async def test_a_server_that_does_not_answer_keeps_its_last_figures_until_they_age() -> None:
    clock = Clock()
    servers, book = loaded_set(clock)
    busy = Load(running=2, waiting=1, kv_cache_usage=0.5)
    await scrape_once([servers], Reader({A: busy, B: busy}), interval_s=1)
    clock.now += 2
    assert await scrape_once([servers], Reader({B: busy}), interval_s=1) == {B: busy}
    assert book.fresh(A) == busy
    clock.now += 1.5
    assert book.fresh(A) is None and book.fresh(B) == busy


async def test_the_scraper_survives_a_failing_round_and_stops_when_cancelled() -> None:
    rounds: list[int] = []
    done = asyncio.Event()

    def sets() -> list[object]:
        rounds.append(1)
        if len(rounds) == 3:
            done.set()
        if len(rounds) == 1:
            raise RuntimeError("a bug")
        return []

    task = asyncio.create_task(scrape_forever(sets, Reader({}), interval_s=0))
    await done.wait()
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled() and len(rounds) >= 3
