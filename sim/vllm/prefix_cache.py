"""A server's prefix cache: prompt blocks hashed as a chain, kept in an LRU of GPU blocks.

Each full block of ``block_size`` tokens is named by a SHA-256 over its parent block's
hash and its own token ids, so a block hash stands for the whole prefix up to it, as in
vLLM's prefix caching. A partial last block is never cached. As in vLLM, a hit never
covers the prompt's last token: it must be computed to produce the first output token.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The chained hash of each full block of ``token_ids``, first block first."""
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block)).digest()
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class Admission:
    """What caching one prompt did: tokens found, its blocks (all, newly stored) and the
    blocks evicted to make room."""

    cached_tokens: int
    hashes: list[bytes] = field(default_factory=list)
    stored: list[bytes] = field(default_factory=list)
    evicted: list[bytes] = field(default_factory=list)


class PrefixCache:
    """At most ``num_blocks`` block hashes, least recently used evicted first."""

    def __init__(self, block_size: int, num_blocks: int) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def admit(self, token_ids: Sequence[int]) -> Admission:
        """Look ``token_ids`` up (the leading cached blocks), then cache all its full blocks."""
        hashes = block_hashes(token_ids, self.block_size)
        reusable = max(len(token_ids) - 1, 0) // self.block_size
        hits = 0
        for block_hash in hashes[:reusable]:
            if block_hash not in self._blocks:
                break
            hits += 1
        admission = Admission(hits * self.block_size, hashes)
        for block_hash in hashes:
            if block_hash in self._blocks:
                self._blocks.move_to_end(block_hash)
            else:
                self._blocks[block_hash] = None
                admission.stored.append(block_hash)
        while len(self._blocks) > self.num_blocks:
            evicted, _ = self._blocks.popitem(last=False)
            admission.evicted.append(evicted)
        return admission

    def clear(self) -> int:
        """Forget every block; how many there were."""
        count = len(self._blocks)
        self._blocks.clear()
        return count
