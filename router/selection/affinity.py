"""Request-aware scorers: send a prompt where its prefix is already in a KV cache.

Agent loops and chat sessions send a growing context every turn; the prefill server that
computed the previous turn still holds most of it. `PrefixAffinity` remembers the prompt
blocks each server was sent recently and scores each server by the share of the prompt it
would not have to compute; the set weighs that against the work already in flight there
(both in units of this prompt), so the choice is the server expected to start it soonest
and one hot conversation cannot pin a busy server. `SessionAffinity` maps a session key to
a stable preferred server for requests whose prefix is not known anywhere.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

DEFAULT_BLOCK_SIZE = 16
DEFAULT_MAX_IMBALANCE = 4
"""A session's preference yields to a server this many requests less busy."""
BLOCKS_PER_SERVER = 100_000
"""A prompt's blocks are remembered per server up to this many (16-byte keys: a few MB)."""
BLOCK_TTL_S = 600.0
"""Blocks older than this are forgotten: the server has likely evicted them by then."""

ROOT_HASH = b"\0" * 16


@dataclass(frozen=True, slots=True)
class Affinity:
    """What a request offers the request-aware scorers."""

    blocks: tuple[bytes, ...] = ()
    """The chained hashes of the prompt's full blocks, first block first."""
    session: str | None = None
    tokens: int = 0
    """The prompt's length in tokens (0: not known)."""
    block_size: int = DEFAULT_BLOCK_SIZE


def block_hashes(
    ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, *, parent: bytes = ROOT_HASH
) -> tuple[bytes, ...]:
    """Each full block's hash covers its parent's hash and its own token ids, so equal
    hashes mean equal prefixes. A trailing partial block is not hashed (no cache holds it
    either). `parent`: the hash of the block before `ids` (none: the prompt's start)."""
    # One packing of the whole prompt, then a hash per block over a view of its bytes.
    packed = memoryview(array("I", ids).tobytes() if ids else b"")
    step = block_size * 4
    hashes = []
    for start in range(0, len(packed) - step + 1, step):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(packed[start : start + step])
        parent = digest.digest()
        hashes.append(parent)
    return tuple(hashes)


class BlockIndex(Protocol):
    """Which leading blocks of a prompt each server holds."""

    def record(self, url: str, blocks: Sequence[bytes]) -> None:
        """`blocks` were sent to `url`."""
        ...

    def matched(self, url: str, blocks: Sequence[bytes]) -> int: ...

    def size(self, url: str) -> int: ...

    def adopt(self, old: BlockIndex, urls: Collection[str]) -> None:
        """Take over what `old` (the index this one replaces on a reload) holds of `urls`,
        if it is an index of the same kind."""
        ...


class PrefixIndex:
    """The blocks each server was sent recently: an LRU per server, bounded in size and age."""

    def __init__(
        self,
        *,
        max_blocks: int = BLOCKS_PER_SERVER,
        ttl_s: float = BLOCK_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_blocks = max_blocks
        self._ttl_s = ttl_s
        self._clock = clock
        self._blocks: dict[str, OrderedDict[bytes, float]] = {}

    def record(self, url: str, blocks: Sequence[bytes]) -> None:
        now = self._clock()
        held = self._blocks.setdefault(url, OrderedDict())
        for block in blocks:
            held[block] = now
            held.move_to_end(block)
        self._evict(held, now)

    def matched(self, url: str, blocks: Sequence[bytes]) -> int:
        """How many leading blocks of `blocks` `url` holds (the chain makes a held block
        imply its parents were sent there too, so the first miss ends the match)."""
        held = self._blocks.get(url)
        if not held:
            return 0
        oldest = self._clock() - self._ttl_s
        count = 0
        for block in blocks:
            seen = held.get(block)
            if seen is None or seen < oldest:
                break
            count += 1
        return count

    def size(self, url: str) -> int:
        return len(self._blocks.get(url, ()))

    def adopt(self, old: BlockIndex, urls: Collection[str]) -> None:
        if not isinstance(old, PrefixIndex):
            return
        for url in urls:
            if (held := old._blocks.get(url)) is not None:
                self._blocks[url] = held  # shared, not copied: up to 100,000 blocks each

    def _evict(self, held: OrderedDict[bytes, float], now: float) -> None:
        while len(held) > self._max_blocks:
            held.popitem(last=False)
        oldest = now - self._ttl_s
        while held and next(iter(held.values())) < oldest:
            held.popitem(last=False)


def _within_balance(url: str, load: Mapping[str, float], max_imbalance: float) -> bool:
    return load[url] - min(load.values()) <= max_imbalance


class PrefixAffinity:
    """Scores a server by the share of the prompt it holds: minus the cached tokens in units
    of the prompt (a whole cached prompt is worth one prompt's work in flight)."""

    name = "prefix"

    def __init__(self, index: BlockIndex | None = None, *, weight: float = 1.0) -> None:
        self.index: BlockIndex = index or PrefixIndex()
        self.weight = weight

    def score(self, url: str, load: Mapping[str, float], request: Affinity) -> float:
        if not request.blocks or not request.tokens:
            return 0.0
        return -self.cached_tokens(url, request) / request.tokens

    def cached_tokens(self, url: str, request: Affinity) -> int:
        if not request.blocks:
            return 0
        matched = self.index.matched(url, request.blocks) * request.block_size
        return min(matched, request.tokens)

    def reason(self, url: str, request: Affinity) -> str:
        return f"prefix:{self.index.matched(url, request.blocks)} blocks"

    def sent(self, url: str, request: Affinity) -> None:
        self.index.record(url, request.blocks)

    def adopt(self, old: object, urls: Collection[str]) -> None:
        if isinstance(old, PrefixAffinity):
            self.index.adopt(old.index, urls)


class SessionAffinity:
    """A session's preferred server by rendezvous hashing over the candidates: stable while
    the set is, and only the sessions of a server that leaves move. Worth half a request's
    work (a whole cached prompt is worth one), and nothing on a server more than
    `max_imbalance` requests busier than the least busy candidate."""

    name = "session"

    def __init__(
        self, *, max_imbalance: float = DEFAULT_MAX_IMBALANCE, weight: float = 0.5
    ) -> None:
        self.max_imbalance = max_imbalance
        self.weight = weight

    def score(self, url: str, load: Mapping[str, float], request: Affinity) -> float:
        if request.session is None or not _within_balance(url, load, self.max_imbalance):
            return 0.0
        return -1.0 if url == preferred(request.session, list(load)) else 0.0

    def cached_tokens(self, url: str, request: Affinity) -> int:
        return 0

    def reason(self, url: str, request: Affinity) -> str:
        return self.name

    def sent(self, url: str, request: Affinity) -> None:
        return None


def preferred(session: str, urls: Sequence[str]) -> str:
    """The rendezvous (highest random weight) choice of `session` among `urls`."""
    return max(urls, key=lambda url: _weight(session, url))


def _weight(session: str, url: str) -> bytes:
    return hashlib.blake2b(f"{session}\0{url}".encode(), digest_size=8).digest()
