"""The exact prefix index: what each vLLM server's KV cache holds, as its KV-cache events
tell it (`--kv-events-config`, a ZMQ PUB socket).

Each message is three frames: the topic, an 8-byte big-endian sequence number and a msgpack
batch `[ts, events, data_parallel_rank]`; each event is a map tagged by `type`:
`BlockStored` (blocks newly cached, chained to `parent_block_hash`), `BlockRemoved`,
`AllBlocksCleared`.

vLLM's block hashes cannot be computed here (its default hash pickles Python objects), so
each stored block is hashed again as `block_hashes` hashes a prompt: its token ids chained
to our hash of its parent, found through the vLLM hash -> our hash map kept per server.
A server's index is only trusted while its events follow each other: a gap in the sequence,
a message that does not decode or a lost connection clears it and marks it unknown until the
next message in sequence, and meanwhile requests are matched against the blocks sent there
(`PrefixIndex`), as without events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import msgpack
import zmq
import zmq.asyncio

from router.selection.affinity import ROOT_HASH, BlockIndex, PrefixIndex, block_hashes

log = logging.getLogger("pd_gateway.kv_events")

DEFAULT_PORT = 5557
BLOCKS_PER_SERVER = 1_000_000
"""Blocks remembered per server (two maps of 16-byte keys: some 200 MB at the cap); beyond
it the oldest stored are forgotten (counted as evictions)."""
PROVISIONAL_S = 2.0
"""A prompt sent to a live server counts as held there this long: its blocks' events come
only once the server has computed them, and the next turn may come sooner."""
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""A larger message is refused by ZMQ (the connection drops: the index becomes unknown)."""
DECODE_IN_THREAD_BYTES = 256 * 1024
"""Messages larger than this are decoded off the event loop."""
BLOCKS_PER_STEP = 1024
"""Blocks hashed between two yields to the event loop."""
FOLLOW_INTERVAL_S = 2.0
"""How often the servers to follow are asked again (a reload may change them)."""

BlockKey = int | bytes
"""A block hash as vLLM's events carry it."""
State = Literal["waiting", "live", "unknown"]


class MalformedMessage(ValueError):
    """A message that is not a KV event batch as vLLM sends it."""


@dataclass(frozen=True, slots=True)
class Source:
    """Where a server's events come from, and the block size its prefix index uses."""

    endpoint: str
    topic: str
    block_size: int


def endpoint_of(url: str, *, port: int = DEFAULT_PORT, endpoints: Mapping[str, str]) -> str:
    """The explicit endpoint given for `url`, else `tcp://<host of url>:<port>`."""
    if url in endpoints:
        return endpoints[url]
    host = urlsplit(url).hostname or "127.0.0.1"
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class ServerBlocks:
    """The blocks one server holds, by its events. Fed one message at a time, in order."""

    def __init__(self, block_size: int, *, max_blocks: int = BLOCKS_PER_SERVER) -> None:
        self.block_size = block_size
        self._max_blocks = max_blocks
        self._ours: OrderedDict[BlockKey, bytes] = OrderedDict()  # vLLM hash -> ours
        self._held: dict[bytes, int] = {}  # our hash -> how many vLLM hashes name it
        self._last_seq: int | None = None
        self._generation = 0  # bumped when the index is cleared as unknown
        self.state: State = "waiting"
        self.last_message_at: float | None = None
        """When the server's last message arrived (Unix time): how fresh the index is."""
        self.evictions = 0
        self.lost: Counter[str] = Counter()
        self.ignored: Counter[str] = Counter()

    @property
    def live(self) -> bool:
        return self.state == "live"

    def matched(self, blocks: Sequence[bytes]) -> int:
        count = 0
        for block in blocks:
            if block not in self._held:
                break
            count += 1
        return count

    def size(self) -> int:
        return len(self._held)

    def follows(self, seq: int) -> bool:
        """Whether the message numbered `seq` follows the last one (the first always does);
        a gap (a restarted server starts again from 0) makes the index unknown."""
        self.last_message_at = time.time()
        last, self._last_seq = self._last_seq, seq
        if last is not None and seq != last + 1:
            self.mark_unknown("gap")
            return False
        return True

    def mark_unknown(self, reason: str) -> None:
        """Events were missed: forget everything until the next message in sequence."""
        self._clear()
        self._generation += 1
        self.lost[reason] += 1
        if reason != "gap":
            self._last_seq = None
        self.state = "unknown"

    def apply(self, events: object) -> Iterator[None]:
        """Apply one batch's events, yielding between bounded steps of work. Raises
        MalformedMessage for events that are not vLLM's (the caller marks the index
        unknown); stops early if the index is cleared meanwhile."""
        if not isinstance(events, list):
            raise MalformedMessage("the events are not an array")
        generation = self._generation
        self.state = "live"
        for event in events:
            if not isinstance(event, dict):
                raise MalformedMessage("an event is not a map")
            kind = event.get("type")
            if kind == "BlockStored":
                for _ in self._stored(event):
                    yield
                    if self._generation != generation:
                        return
            elif kind == "BlockRemoved":
                for key in _keys(event.get("block_hashes")):
                    self._forget(key)
            elif kind == "AllBlocksCleared":
                self._clear()
            else:
                self.ignored["type"] += 1  # an event of a later vLLM: not ours to judge
            yield
            if self._generation != generation:
                return

    def apply_now(self, events: object) -> None:
        """`apply` in one go (tests, small batches)."""
        for _ in self.apply(events):
            pass

    def _stored(self, event: dict[Any, Any]) -> Iterator[None]:
        keys = _keys(event.get("block_hashes"))
        parent_key = event.get("parent_block_hash")
        if parent_key is not None:
            parent_key = _key(parent_key)
        token_ids = event.get("token_ids")
        block_size = event.get("block_size")
        if not isinstance(token_ids, list) or not isinstance(block_size, int):
            raise MalformedMessage("BlockStored without token_ids or block_size")
        if block_size != self.block_size:
            if not self.ignored["block_size"]:
                log.warning(
                    "KV events of %d-token blocks ignored: selection.block_size is %d",
                    block_size,
                    self.block_size,
                )
            self.ignored["block_size"] += 1
            return
        if len(token_ids) != len(keys) * block_size:
            self.ignored["shape"] += 1  # blocks left out (sliding window): no chain to follow
            return
        parent = ROOT_HASH if parent_key is None else self._ours.get(parent_key)
        if parent is None:
            self.ignored["orphan"] += 1  # its parent came before we listened, or was evicted
            return
        step = BLOCKS_PER_STEP
        for first in range(0, len(keys), step):
            ids = token_ids[first * block_size : (first + step) * block_size]
            try:
                ours = block_hashes(ids, block_size, parent=parent)
            except (TypeError, OverflowError) as exc:
                raise MalformedMessage(f"token ids that are not uint32: {exc}") from None
            for key, block in zip(keys[first : first + step], ours, strict=True):
                self._store(key, block)
            parent = ours[-1]
            yield

    def _store(self, key: BlockKey, block: bytes) -> None:
        before = self._ours.get(key)
        if before is not None:
            self._ours.move_to_end(key)
            if before == block:
                return
            self._release(before)
        self._ours[key] = block
        self._held[block] = self._held.get(block, 0) + 1
        while len(self._ours) > self._max_blocks:
            _, oldest = self._ours.popitem(last=False)
            self._release(oldest)
            self.evictions += 1

    def _forget(self, key: BlockKey) -> None:
        block = self._ours.pop(key, None)
        if block is not None:
            self._release(block)

    def _release(self, block: bytes) -> None:
        left = self._held[block] - 1
        if left:
            self._held[block] = left
        else:
            del self._held[block]

    def _clear(self) -> None:
        self._ours.clear()
        self._held.clear()

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "blocks": self.size(),
            "evictions": self.evictions,
            "lost": dict(self.lost),
            "ignored": dict(self.ignored),
        }


def _key(value: object) -> BlockKey:
    if isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise MalformedMessage("a block hash that is neither an integer nor bytes")


def _keys(values: object) -> list[BlockKey]:
    if not isinstance(values, list):
        raise MalformedMessage("block_hashes is not an array")
    return [_key(v) for v in values]


def decode(frames: Sequence[bytes]) -> tuple[bytes, int, bytes]:
    """(topic, sequence number, payload) of a message's frames."""
    if len(frames) != 3:
        raise MalformedMessage(f"{len(frames)} frames, not 3")
    topic, seq, payload = frames
    if len(seq) != 8:
        raise MalformedMessage("a sequence number that is not 8 bytes")
    return topic, int.from_bytes(seq, "big"), payload


def unpack_events(payload: bytes) -> object:
    """The events of a batch's msgpack payload (checked further as they are applied)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several kinds for corrupt data
        raise MalformedMessage(f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(batch, list) or len(batch) < 2:
        raise MalformedMessage("the batch is not an array [ts, events, ...]")
    return batch[1]


async def receive(blocks: ServerBlocks, frames: Sequence[bytes], topic: bytes) -> None:
    """Apply one message to `blocks`; one that is not a batch marks the index unknown."""
    try:
        got_topic, seq, payload = decode(frames)
        if got_topic != topic:
            return  # ZMQ matches topics by prefix: another topic that starts with ours
        if not blocks.follows(seq):
            return
        if len(payload) > DECODE_IN_THREAD_BYTES:
            events = await asyncio.to_thread(unpack_events, payload)
        else:
            events = unpack_events(payload)
        for _ in blocks.apply(events):
            await asyncio.sleep(0)
    except MalformedMessage as exc:
        if blocks.state != "unknown":  # once per run of them
            log.warning("a KV event message that does not decode: %s", exc)
        blocks.mark_unknown("decode")


async def subscribe(context: zmq.asyncio.Context, source: Source, blocks: ServerBlocks) -> None:
    """Follow one server's events into `blocks` until cancelled."""
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    socket.setsockopt(zmq.LINGER, 0)
    topic = source.topic.encode()
    socket.setsockopt(zmq.SUBSCRIBE, topic)
    monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    poller = zmq.asyncio.Poller()
    poller.register(socket, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    try:
        socket.connect(source.endpoint)
        while True:
            ready = dict(await poller.poll())
            if monitor in ready:
                await monitor.recv_multipart()  # the one event asked for: disconnected
                blocks.mark_unknown("disconnected")
            if socket in ready:
                await receive(blocks, await socket.recv_multipart(), topic)
    finally:
        socket.disable_monitor()
        monitor.close(linger=0)
        socket.close(linger=0)


class KvEventsHub:
    """One subscriber per followed server, shared by every server set naming it (and
    kept across reloads while a server is followed the same way)."""

    def __init__(self, *, max_blocks: int = BLOCKS_PER_SERVER) -> None:
        self._max_blocks = max_blocks
        self._context: zmq.asyncio.Context | None = None
        self._followed: dict[str, tuple[Source, ServerBlocks, asyncio.Task[None]]] = {}

    def server(self, url: str) -> ServerBlocks | None:
        followed = self._followed.get(url)
        return followed[1] if followed is not None else None

    def follow(self, wanted: Mapping[str, Source]) -> None:
        """Follow exactly the servers of `wanted` (a changed source starts afresh)."""
        for url, (source, _, task) in list(self._followed.items()):
            if wanted.get(url) != source:
                task.cancel()
                del self._followed[url]
        for url, source in wanted.items():
            if url in self._followed:
                continue
            if self._context is None:
                self._context = zmq.asyncio.Context()
            blocks = ServerBlocks(source.block_size, max_blocks=self._max_blocks)
            task = asyncio.create_task(self._run(url, source, blocks))
            self._followed[url] = (source, blocks, task)

    async def _run(self, url: str, source: Source, blocks: ServerBlocks) -> None:
        assert self._context is not None
        log.info("following the KV events of %s at %s", url, source.endpoint)
        while True:
            try:
                await subscribe(self._context, source, blocks)
            except asyncio.CancelledError:
                raise
            except Exception:  # nothing may end a subscriber: the index would go stale
                log.exception("following the KV events of %s failed", url)
                blocks.mark_unknown("error")
                await asyncio.sleep(FOLLOW_INTERVAL_S)

    async def follow_forever(self, wanted: Callable[[], Mapping[str, Source]]) -> None:
        """Follow the servers `wanted` names, asked again every interval, until cancelled;
        then stop every subscriber."""
        try:
            while True:
                try:
                    self.follow(wanted())
                except Exception:
                    log.exception("finding the servers whose KV events to follow failed")
                await asyncio.sleep(FOLLOW_INTERVAL_S)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        tasks = [task for _, _, task in self._followed.values()]
        self._followed.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        if self._context is not None:
            self._context.term()
            self._context = None

    def snapshot(self, url: str) -> dict[str, Any] | None:
        followed = self._followed.get(url)
        if followed is None:
            return None
        return {"endpoint": followed[0].endpoint, **followed[1].snapshot()}

    def followed(self) -> dict[str, ServerBlocks]:
        return {url: blocks for url, (_, blocks, _) in self._followed.items()}


STATES: tuple[State, ...] = ("waiting", "live", "unknown")


class KvEventsIndex:
    """A server set's prefix index in the exact mode: a live server's blocks by its events
    (and, for `PROVISIONAL_S`, what was just sent there); the blocks sent to a server whose
    events are not flowing (not yet, or missed)."""

    def __init__(
        self,
        hub: KvEventsHub,
        *,
        sent: PrefixIndex | None = None,
        provisional: PrefixIndex | None = None,
    ) -> None:
        self.hub = hub
        self._sent = sent or PrefixIndex()
        self._provisional = provisional or PrefixIndex(ttl_s=PROVISIONAL_S)

    def record(self, url: str, blocks: Sequence[bytes]) -> None:
        self._sent.record(url, blocks)
        self._provisional.record(url, blocks)

    def matched(self, url: str, blocks: Sequence[bytes]) -> int:
        server = self.hub.server(url)
        if server is None or not server.live:
            return self._sent.matched(url, blocks)
        # Both count from the prompt's first block: the longer prefix is held.
        return max(server.matched(blocks), self._provisional.matched(url, blocks))

    def size(self, url: str) -> int:
        server = self.hub.server(url)
        if server is None or not server.live:
            return self._sent.size(url)
        return server.size()

    def adopt(self, old: BlockIndex, urls: Collection[str]) -> None:
        """What the servers' events say is the hub's, which outlives a reload; what was
        sent to them is taken over."""
        if isinstance(old, KvEventsIndex):
            self._sent.adopt(old._sent, urls)
            self._provisional.adopt(old._provisional, urls)
