from __future__ import annotations

import asyncio
import threading

import pytest

from router.selection import Affinity, PrefixAffinity, PrefixIndex, ServerSet, SessionAffinity
from router.selection.affinity import block_hashes, preferred
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


def prefix_set(urls: list[str]) -> tuple[ServerSet, PrefixAffinity]:
    prefix = PrefixAffinity(max_imbalance=4)
    servers = ServerSet(urls, scorers=[LeastOutstanding()], request_scorers=[prefix])
    return servers, prefix


def test_a_known_prefix_wins_over_a_slightly_busier_server() -> None:
    servers, prefix = prefix_set([A, B])
    request = Affinity(block_hashes(list(range(160))))
    prefix.sent(B, request)
    with servers.hold(B), servers.hold(B):
        choice = servers.pick(request=request)
    assert choice.url == B
    assert choice.reason == "prefix:10 blocks"


def test_a_hot_prefix_does_not_pin_a_loaded_server() -> None:
    servers, prefix = prefix_set([A, B])
    request = Affinity(block_hashes(list(range(160))))
    prefix.sent(B, request)
    with servers.hold(B), servers.hold(B), servers.hold(B), servers.hold(B), servers.hold(B):
        choice = servers.pick(request=request)
        assert choice == servers.pick(request=request)  # no rotation: load decides
    assert (choice.url, choice.reason) == (A, "load")


def test_hold_records_the_request_as_sent() -> None:
    servers, _ = prefix_set([A, B, C])
    request = Affinity(block_hashes(list(range(64))))
    with servers.hold(C, request):
        pass
    assert servers.pick(request=request) == servers.pick(request=request)
    assert servers.pick(request=request).url == C


def test_without_a_request_the_choice_is_unchanged() -> None:
    servers, prefix = prefix_set([A, B])
    prefix.sent(B, Affinity(block_hashes(list(range(64)))))
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
    prefix.sent(B, Affinity(blocks))
    choice = servers.pick(request=Affinity(blocks, session))
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
    assert [len(a.blocks) for a in encoded] == [4] * PROMPTS_AT_ONCE
