"""The exact prefix index: vLLM's KV-cache events re-hashed into our block chain."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from router.config import SelectionConfig
from router.selection import PrefixAffinity, PrefixIndex
from router.selection.affinity import block_hashes
from router.selection.kv_events import (
    BLOCKS_PER_STEP,
    KvEventsHub,
    KvEventsIndex,
    ServerBlocks,
    Source,
    endpoint_of,
    receive,
)
from router.selection.request_keys import AffinityKeys
from router.telemetry.metrics import Metrics

URL = "http://prefill-0:8000"
BS = 4


def stored(
    hashes: list[Any], tokens: list[int], parent: Any = None, block_size: int = BS
) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": tokens,
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[Any]) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


def message(seq: int, events: list[Any], topic: bytes = b"") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), msgpack.packb([time.time(), events, 0])]


def test_the_chain_of_stored_blocks_is_block_hashes_of_their_tokens() -> None:
    ids = list(range(100, 120))  # five blocks of four
    server = ServerBlocks(BS)
    # Stored in two runs, the second chained to the first's last block (a bytes hash).
    server.apply_now([stored([11, 12], ids[:8]), stored([b"\x0d", 14, 15], ids[8:], parent=12)])
    assert server.live
    assert server.matched(block_hashes(ids, BS)) == 5
    assert server.matched(block_hashes([*ids[:12], 0, 0, 0, 0], BS)) == 3
    assert server.matched(block_hashes(ids[4:], BS)) == 0  # not the same prefix
    assert server.size() == 5


def test_removed_blocks_end_the_match_and_a_clear_empties_the_server() -> None:
    ids = list(range(12))
    server = ServerBlocks(BS)
    server.apply_now([stored([1, 2, 3], ids)])
    server.apply_now([removed([2])])
    assert server.matched(block_hashes(ids, BS)) == 1
    server.apply_now([removed([99])])  # unknown: nothing to do
    server.apply_now([{"type": "AllBlocksCleared"}])
    assert server.size() == 0
    assert server.live  # a cleared cache is known to be empty


def test_the_same_blocks_under_two_vllm_hashes_stay_held_until_both_are_removed() -> None:
    ids = list(range(8))
    server = ServerBlocks(BS)
    # A cache salt (or LoRA) makes vLLM's hashes differ for the same tokens.
    server.apply_now([stored([1, 2], ids), stored([21, 22], ids)])
    assert server.size() == 2
    server.apply_now([removed([1, 2])])
    assert server.matched(block_hashes(ids, BS)) == 2
    server.apply_now([removed([21])])
    assert server.matched(block_hashes(ids, BS)) == 0


def test_a_block_whose_parent_is_unknown_is_ignored() -> None:
    server = ServerBlocks(BS)
    server.apply_now([stored([5], [1, 2, 3, 4], parent=4)])
    assert server.size() == 0
    assert server.ignored["orphan"] == 1


def test_blocks_of_another_block_size_are_ignored_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = ServerBlocks(16)
    with caplog.at_level(logging.WARNING, "pd_gateway.kv_events"):
        server.apply_now([stored([1], list(range(4)), block_size=4)])
        server.apply_now([stored([2], list(range(4)), block_size=4)])
    assert server.size() == 0
    assert server.ignored["block_size"] == 2
    assert len(caplog.records) == 1
    assert "selection.block_size is 16" in caplog.records[0].getMessage()


def test_memory_is_bounded_the_oldest_blocks_going_first() -> None:
    ids = list(range(24))
    server = ServerBlocks(BS, max_blocks=4)
    server.apply_now([stored([1, 2, 3, 4, 5, 6], ids)])
    assert server.size() == 4
    assert server.evictions == 2
    assert server.matched(block_hashes(ids, BS)) == 0  # the first blocks went first
    # A block stored again is fresh again.
    server.apply_now([stored([3], ids[8:12], parent=None)])
    server.apply_now([stored([7], ids[:4])])
    assert server.evictions == 3
    assert server.size() == 4


def test_a_gap_in_the_sequence_clears_the_server_until_the_next_message() -> None:
    ids = list(range(8))
    server = ServerBlocks(BS)
    assert server.state == "waiting"
    assert server.follows(7)  # the first message may start anywhere
    server.apply_now([stored([1, 2], ids)])
    assert server.follows(8)
    assert not server.follows(10)
    assert server.state == "unknown"
    assert server.size() == 0
    assert server.lost["gap"] == 1
    assert server.follows(11)
    server.apply_now([])
    assert server.live
    assert not server.follows(0)  # a restarted server counts from 0 again


def test_hashing_a_large_batch_yields_to_the_event_loop() -> None:
    blocks = 5 * BLOCKS_PER_STEP
    ids = [i % 50_000 for i in range(blocks * BS)]
    server = ServerBlocks(BS)
    steps = sum(1 for _ in server.apply([stored(list(range(blocks)), ids)]))
    assert steps >= 5
    assert server.matched(block_hashes(ids, BS)) == blocks


def test_malformed_events_raise_for_the_subscriber_to_mark_the_index_unknown() -> None:
    for events in (
        "x",
        [1],
        [{"type": "BlockStored"}],
        [stored(["h"], [1, 2, 3, 4])],
        [stored([True], [1, 2, 3, 4])],
        [stored([1], [1, 2, 3, -4])],
        [stored([1], [1, 2, 3, 2**40])],
        [stored([1], [1, 2, "3", 4])],
        [removed("1")],
    ):
        server = ServerBlocks(BS)
        with pytest.raises(ValueError):
            server.apply_now(events)


async def test_messages_that_are_not_batches_mark_the_index_unknown() -> None:
    server = ServerBlocks(BS)
    await receive(server, message(0, [stored([1], [1, 2, 3, 4])]), b"")
    assert server.size() == 1
    await receive(server, [b"", (1).to_bytes(8, "big"), b"\xc1\xc1"], b"")
    assert (server.state, server.size(), server.lost["decode"]) == ("unknown", 0, 1)
    await receive(server, message(2, [stored([1], [1, 2, 3, 4])]), b"")
    assert server.live and server.size() == 1
    await receive(server, [b"only one frame"], b"")
    assert server.lost["decode"] == 2
    await receive(server, message(5, [stored([9], [1, 2, 3, 4])], topic=b"kv-other"), b"kv")
    assert server.lost["decode"] == 2  # another topic's message: not ours, not an error


frames = st.lists(st.binary(max_size=64), max_size=4)
values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.binary(max_size=8)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=30,
)
event_like = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"]),
        "block_hashes": values,
        "parent_block_hash": values,
        "token_ids": values,
        "block_size": st.integers(-2, 8) | values,
    }
)


@settings(max_examples=200, deadline=None)
@given(frames=frames, events=st.lists(event_like | values, max_size=5), seq=st.integers(0, 5))
async def test_no_message_ends_the_subscriber(
    frames: list[bytes], events: list[Any], seq: int
) -> None:
    server = ServerBlocks(BS)
    await receive(server, frames, b"")
    await receive(server, message(seq, events), b"")
    await receive(server, [b"", seq.to_bytes(8, "big"), msgpack.packb(events)], b"")
    assert server.state in ("waiting", "live", "unknown")
    # Whatever came before, a valid message in sequence is applied.
    await receive(server, [], b"")
    await receive(server, message(100, [stored([1], [1, 2, 3, 4])]), b"")
    assert server.live and server.matched(block_hashes([1, 2, 3, 4], BS)) == 1


async def test_huge_arrays_of_blocks_that_cannot_be_chained_are_not_hashed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hashed: list[int] = []

    def counting(ids: list[int], block_size: int, **options: Any) -> list[bytes]:
        hashed.append(len(ids))
        return block_hashes(ids, block_size, **options)

    monkeypatch.setattr("router.selection.kv_events.block_hashes", counting)
    server = ServerBlocks(BS)
    huge = list(range(2_000_000))
    # Of another block size: ignored without hashing; of a shape that does not add up: same.
    await receive(server, message(0, [stored([1], huge, block_size=16)]), b"")
    await receive(server, message(1, [stored([1, 2], huge)]), b"")
    await receive(server, message(2, [removed(huge)]), b"")
    assert hashed == []
    assert server.size() == 0
    assert server.ignored == {"block_size": 1, "shape": 1}
    await receive(server, message(3, [stored([1, 2], list(range(2 * BS)))]), b"")
    assert hashed == [2 * BS] and server.size() == 2  # the count sees a chained block


def test_an_index_falls_back_to_the_blocks_sent_while_events_do_not_flow() -> None:
    hub = KvEventsHub()
    index = KvEventsIndex(hub)
    blocks = block_hashes(list(range(16)), BS)
    index.record(URL, blocks)
    assert index.matched(URL, blocks) == 4  # not followed: sent blocks only
    server = ServerBlocks(BS)
    hub._followed[URL] = (Source("tcp://x:1", "", BS), server, None)  # type: ignore[assignment]
    assert index.matched(URL, blocks) == 4  # waiting for its first event
    server.follows(0)
    server.apply_now([stored([1, 2], list(range(8)))])
    assert index.matched(URL, blocks) == 4  # just sent: provisional
    server.mark_unknown("gap")
    assert index.matched(URL, blocks) == 4
    assert index.size(URL) == 4


def test_an_index_that_replaces_another_keeps_the_blocks_sent_and_the_hubs_events() -> None:
    hub = KvEventsHub()
    old = KvEventsIndex(hub)
    blocks = block_hashes(list(range(16)), BS)
    old.record(URL, blocks)
    new = KvEventsIndex(hub)
    new.adopt(old, [URL])
    assert new.matched(URL, blocks) == 4  # not followed: the blocks sent there
    server = ServerBlocks(BS)
    hub._followed[URL] = (Source("tcp://x:1", "", BS), server, None)  # type: ignore[assignment]
    server.follows(0)
    server.apply_now([stored([1, 2], list(range(8)))])
    assert new.matched(URL, blocks) == 4  # live: the hub's two, and just sent: provisional
    sent = PrefixIndex()
    sent.record(URL, blocks)
    other = KvEventsIndex(hub)
    other.adopt(sent, [URL])  # an index of another kind (the mode changed): nothing taken
    assert other.matched(URL, blocks) == 2  # what the hub's events say alone


def test_sent_blocks_count_on_a_live_server_only_while_provisional() -> None:
    now = [0.0]
    hub = KvEventsHub()
    index = KvEventsIndex(hub, provisional=PrefixIndex(ttl_s=2.0, clock=lambda: now[0]))
    server = ServerBlocks(BS)
    hub._followed[URL] = (Source("tcp://x:1", "", BS), server, None)  # type: ignore[assignment]
    server.apply_now([stored([1, 2], list(range(8)))])
    blocks = block_hashes(list(range(16)), BS)
    index.record(URL, blocks)
    assert index.matched(URL, blocks) == 4
    now[0] = 2.5
    assert index.matched(URL, blocks) == 2  # what the events say
    server.apply_now([{"type": "AllBlocksCleared"}])
    assert index.matched(URL, blocks) == 0
    assert index.size(URL) == 0


def test_the_endpoint_is_the_explicit_one_else_the_servers_host_and_port() -> None:
    given_ = {URL: "tcp://10.0.0.9:6000"}
    assert endpoint_of(URL, endpoints=given_) == "tcp://10.0.0.9:6000"
    assert endpoint_of("http://prefill-1:8000", endpoints=given_) == "tcp://prefill-1:5557"
    assert endpoint_of("https://[::1]:8000", port=7, endpoints={}) == "tcp://[::1]:7"


def test_the_configuration_names_the_index_and_the_endpoints() -> None:
    config = SelectionConfig.model_validate(
        {
            "prefix_index": "kv_events",
            "kv_events": {"port": 6000, "topic": "kv", "endpoints": {URL + "/": "tcp://h:1"}},
        }
    )
    assert config.kv_events.endpoints == {URL: "tcp://h:1"}
    assert SelectionConfig().prefix_index == "sent"
    for bad in (
        {"prefix_index": "exact"},
        {"kv_events": {"endpoints": {URL: "http://h:1"}}},
        {"kv_events": {"endpoints": {"prefill:8000": "tcp://h:1"}}},
        {"kv_events": {"port": 0}},
    ):
        with pytest.raises(ValueError):
            SelectionConfig.model_validate(bad)


def test_affinity_keys_give_each_set_a_kv_events_index_over_the_shared_hub() -> None:
    hub = KvEventsHub()
    keys = AffinityKeys(lambda endpoint, body: [], kv_events=hub)
    first, second = keys.scorers()[0], keys.scorers()[0]
    assert isinstance(first, PrefixAffinity) and isinstance(second, PrefixAffinity)
    assert isinstance(first.index, KvEventsIndex) and first.index.hub is hub
    assert first.index is not second.index
    plain = AffinityKeys(lambda endpoint, body: []).scorers()[0]
    assert isinstance(plain, PrefixAffinity) and not isinstance(plain.index, KvEventsIndex)


async def until(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not in time: {what}"
        await asyncio.sleep(0.02)


async def test_a_subscriber_follows_a_publisher_and_notices_it_go() -> None:
    context = zmq.asyncio.Context()
    publisher = context.socket(zmq.PUB)
    publisher.bind("tcp://127.0.0.1:*")
    endpoint = publisher.getsockopt_string(zmq.LAST_ENDPOINT)
    hub = KvEventsHub()
    follower = asyncio.create_task(hub.follow_forever(lambda: {URL: Source(endpoint, "kv", BS)}))
    try:
        await until(lambda: hub.server(URL) is not None, "followed")
        server = hub.server(URL)
        assert server is not None
        ids = list(range(8))
        seq = 0
        # A subscription takes effect some time after connecting: publish until one arrives.
        while not server.live:
            await publisher.send_multipart(message(seq, [stored([1, 2], ids)], topic=b"kv"))
            seq += 1
            await asyncio.sleep(0.02)
        assert server.matched(block_hashes(ids, BS)) == 2
        assert hub.snapshot(URL) == {
            "endpoint": endpoint,
            "state": "live",
            "blocks": 2,
            "evictions": 0,
            "lost": {},
            "ignored": {},
        }
        rendered = Metrics().render({}, {}, hub.followed()).decode()
        assert f'pd_gateway_kv_events_state{{state="live",url="{URL}"}} 1.0' in rendered
        arrived = server.last_message_at
        assert arrived is not None and abs(arrived - time.time()) < 60
        freshness = f'pd_gateway_kv_events_last_message_timestamp_seconds{{url="{URL}"}} '
        assert freshness + floatToGoString(arrived) in rendered
        publisher.close(linger=0)
        await until(lambda: server.state == "unknown", "the lost publisher noticed")
        assert server.lost["disconnected"] == 1 and server.size() == 0
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        context.term()
    assert hub.server(URL) is None
