from __future__ import annotations

import asyncio
import threading
import tracemalloc

import pytest

from router.selection import (
    Affinity,
    Choice,
    PrefixAffinity,
    PrefixIndex,
    ServerSet,
    SessionAffinity,
)
from router.selection.affinity import BLOCKS_PER_SERVER, block_hashes, preferred
from router.selection.request_keys import PROMPTS_AT_ONCE, AffinityKeys
from router.selection.server_set import LeastOutstanding

A, B, C = "http://a", "http://b", "http://c"


def test_block_hashes_chain_full_blocks_only() -> None:
    ids = list(range(40))
    hashes = block_hashes(ids, 16)
    assert len(hashes) == 2  # the last 8 tokens fill no block
    assert block_hashes(ids[:32] + [999] * 16, 16)[:2] == hashes
    # A block's hash depends on what precedes it.
    assert block_hashes([7, *ids[1:32]], 16)[1] != hashes[1]
    assert block_hashes(ids, 4)[:1] != hashes[:1]


def test_index_matches_leading_blocks_only() -> None:
    index = PrefixIndex()
    first = block_hashes(list(range(64)))
    index.record(A, first)
    assert index.matched(A, first) == 4
    assert index.matched(A, block_hashes(list(range(48)) + [1] * 32)) == 3
    assert index.matched(B, first) == 0


def test_index_is_bounded_in_size_and_age() -> None:
    now = [0.0]
    index = PrefixIndex(max_blocks=3, ttl_s=10, clock=lambda: now[0])
    blocks = block_hashes(list(range(16 * 5)))
    index.record(A, blocks)
    assert index.size(A) == 3
    assert index.matched(A, blocks) == 0  # the oldest (leading) blocks were evicted
    index.record(A, blocks[:2])
    assert index.matched(A, blocks) == 2
    now[0] = 11.0
    assert index.matched(A, blocks) == 0
    index.record(B, blocks[:1])
    index.record(A, [])
    assert index.size(A) == 0


def test_an_index_that_replaces_another_keeps_the_blocks_of_the_servers_it_names() -> None:
    old = PrefixIndex()
    blocks = block_hashes(list(range(64)))
    old.record(A, blocks)
    old.record(B, blocks)
    new = PrefixIndex()
    new.adopt(old, [A, C])
    assert (new.matched(A, blocks), new.matched(B, blocks)) == (4, 0)
    old.record(A, block_hashes(list(range(80))))  # sent by a request of the replaced set
    assert new.matched(A, block_hashes(list(range(80)))) == 5


def prefix_set(urls: list[str]) -> tuple[ServerSet, PrefixAffinity]:
    prefix = PrefixAffinity()
    servers = ServerSet(urls, scorers=[LeastOutstanding()], request_scorers=[prefix])
    return servers, prefix


def prompt(tokens: int, first: int = 0) -> Affinity:
    ids = list(range(first, first + tokens))
    return Affinity(block_hashes(ids), tokens=tokens)


def test_a_known_prefix_wins_over_a_server_with_less_work() -> None:
    servers, prefix = prefix_set([A, B])
    request = prompt(160)
    prefix.sent(B, request)
    with servers.hold(B, prompt(32, first=1000)):  # 32 tokens to compute ahead on B
        choice = servers.pick(request=request)
    assert choice.url == B
    assert choice.reason == "prefix:10 blocks"


def test_a_hot_prefix_does_not_pin_a_loaded_server() -> None:
    servers, prefix = prefix_set([A, B])
    request = prompt(160)
    prefix.sent(B, request)
    # More than the whole prompt's work ahead on B: A computes it all sooner.
    with servers.hold(B, prompt(200, first=1000)):
        choice = servers.pick(request=request)
        assert choice == servers.pick(request=request)  # no rotation: load decides
    assert (choice.url, choice.reason) == (A, "load")


def test_a_request_of_unknown_length_counts_as_one_prompt() -> None:
    servers, prefix = prefix_set([A, B])
    request = prompt(160)
    prefix.sent(B, request)
    with servers.hold(B):  # one request ahead, length unknown: as long as this one
        assert servers.pick(request=request).url in (A, B)
        with servers.hold(B):
            assert servers.pick(request=request) == Choice(A, "load")


def test_work_in_flight_is_the_uncached_part_and_ends_with_the_request() -> None:
    servers, prefix = prefix_set([A, B])
    first = prompt(160)
    prefix.sent(B, first)
    grown = prompt(320)  # the same 160 tokens, then 160 more
    with servers.hold(B, grown):  # 160 tokens left to compute on B, not 320
        assert servers.pick(request=prompt(320, first=5000)) == Choice(A, "load")
        other = prompt(160, first=9000)
        with servers.hold(A, other), servers.hold(A, prompt(160, first=7000)):
            # A: 320 tokens ahead; B: 160 ahead.
            assert servers.pick(request=prompt(320, first=5000)) == Choice(B, "load")
    assert servers.pick(request=grown).url == B  # nothing ahead; B holds all 320 now


def test_hold_records_the_request_as_sent() -> None:
    servers, _ = prefix_set([A, B, C])
    request = prompt(64)
    with servers.hold(C, request):
        pass
    assert servers.pick(request=request) == servers.pick(request=request)
    assert servers.pick(request=request).url == C


def test_without_a_request_the_choice_is_unchanged() -> None:
    servers, prefix = prefix_set([A, B])
    prefix.sent(B, prompt(64))
    assert servers.pick().reason == "rotation"


@pytest.mark.parametrize("session", ["alice", "bob", "conversation-42"])
def test_a_session_prefers_one_stable_server(session: str) -> None:
    servers = ServerSet(
        [A, B, C], scorers=[LeastOutstanding()], request_scorers=[SessionAffinity()]
    )
    request = Affinity(session=session)
    choices = {servers.pick(request=request) for _ in range(5)}
    assert len(choices) == 1
    (choice,) = choices
    assert choice.url == preferred(session, [A, B, C])
    assert choice.reason == "session"
    # A server leaving moves only its own sessions.
    others = [url for url in (A, B, C) if url != choice.url]
    stay = next(url for url in (A, B, C) if url in others)
    assert preferred(session, [choice.url, stay]) == choice.url


def test_rendezvous_spreads_sessions() -> None:
    counts = {A: 0, B: 0, C: 0}
    for i in range(300):
        counts[preferred(f"s{i}", [A, B, C])] += 1
    assert min(counts.values()) > 60


def test_a_prefix_outweighs_a_session() -> None:
    prefix = PrefixAffinity()
    servers = ServerSet(
        [A, B], scorers=[LeastOutstanding()], request_scorers=[prefix, SessionAffinity()]
    )
    blocks = block_hashes(list(range(64)))
    session = next(s for s in (f"s{i}" for i in range(100)) if preferred(s, [A, B]) == A)
    prefix.sent(B, Affinity(blocks, tokens=64))
    choice = servers.pick(request=Affinity(blocks, session, tokens=64))
    assert (choice.url, choice.reason) == (B, "prefix:4 blocks")


async def test_a_request_never_waits_for_its_prefix_to_be_encoded() -> None:
    """While every encoding slot is busy, a request goes on with no prefix affinity."""
    release, started = threading.Event(), threading.Semaphore(0)

    def slow_ids(endpoint: str, body: dict[str, object]) -> list[int]:
        started.release()
        release.wait(timeout=30)
        return list(range(64))

    keys = AffinityKeys(slow_ids, block_size=16)
    body = {"messages": [], "user": "u1"}
    busy = [asyncio.create_task(keys.of("chat", body, {})) for _ in range(PROMPTS_AT_ONCE)]
    for _ in range(PROMPTS_AT_ONCE):
        await asyncio.to_thread(started.acquire)
    skipped = await keys.of("chat", body, {})
    release.set()
    encoded = await asyncio.gather(*busy)
    assert skipped == Affinity((), "u1")
    assert [(len(a.blocks), a.tokens) for a in encoded] == [(4, 64)] * PROMPTS_AT_ONCE


def test_the_index_stays_within_its_bound_under_100k_distinct_prompts() -> None:
    index = PrefixIndex()
    prompts = [tuple((4 * i + j).to_bytes(16, "big") for j in range(4)) for i in range(100_000)]
    tracemalloc.start()
    try:
        for blocks in prompts[:50_000]:  # 200,000 blocks: twice what a server keeps
            index.record(A, blocks)
        half, _ = tracemalloc.get_traced_memory()
        for blocks in prompts[50_000:]:
            index.record(A, blocks)
        full, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert index.size(A) == BLOCKS_PER_SERVER  # 400,000 blocks sent: the newest kept
    assert index.matched(A, prompts[-1]) == 4 and index.matched(A, prompts[0]) == 0
    # A plateau (about 180 bytes a kept block); kept, the second half would add 35 MB.
    assert full < 250 * BLOCKS_PER_SERVER
    assert abs(full - half) < 2 * 1024 * 1024
