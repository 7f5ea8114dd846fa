"""What a request offers the request-aware scorers: its prompt's block hashes, its session.

The prompt is rendered and encoded as the prompt counter does (the model's chat template
and tokenizer), in a thread: encoding a long prompt takes hundreds of ms. Hashing is linear
in the prompt and runs in the same thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from router.selection.affinity import (
    DEFAULT_BLOCK_SIZE,
    Affinity,
    PrefixAffinity,
    SessionAffinity,
    block_hashes,
)
from router.selection.kv_events import KvEventsHub, KvEventsIndex
from router.selection.server_set import RequestScorer, Weights

PromptIds = Callable[[str, dict[str, Any]], list[int]]
"""(wire endpoint, body) -> the prompt's token ids."""

DEFAULT_SESSION_HEADER = "x-session-id"
PROMPTS_AT_ONCE = 2
"""Each encoding holds a tokenizer's working memory and a thread: a few at a time, whatever
the load; a request that finds them all taken is served without prefix affinity."""


class AffinityKeys:
    def __init__(
        self,
        prompt_ids: PromptIds | None,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        session_header: str = DEFAULT_SESSION_HEADER,
        kv_events: KvEventsHub | None = None,
    ) -> None:
        """`prompt_ids` None: no prefix affinity, sessions only. `kv_events`: prefixes are
        matched against what the servers' KV-cache events say they hold (else against
        what was sent to them)."""
        self._prompt_ids = prompt_ids
        self._block_size = block_size
        self._session_header = session_header.lower()
        self._encoding = asyncio.Semaphore(PROMPTS_AT_ONCE)
        self._kv_events = kv_events

    @property
    def shape(self) -> Hashable:
        """What an `Affinity` of these keys depends on: keys of one shape make the same one
        of a request."""
        return (self._prompt_ids, self._block_size, self._session_header)

    async def of(self, endpoint: str, body: dict[str, Any], headers: Mapping[str, str]) -> Affinity:
        blocks: tuple[bytes, ...] = ()
        tokens = 0
        # Affinity is a preference: a request never queues for it. While every encoding
        # slot is taken, it goes on without its prefix.
        if self._prompt_ids is not None and not self._encoding.locked():
            async with self._encoding:
                blocks, tokens = await asyncio.to_thread(self.prompt_now, endpoint, body)
        session = session_of(body, headers, self._session_header)
        return Affinity(blocks, session, tokens, self._block_size)

    def prompt_now(self, endpoint: str, body: dict[str, Any]) -> tuple[tuple[bytes, ...], int]:
        """The prompt's block hashes and its length in tokens."""
        if self._prompt_ids is None:
            return (), 0
        ids = self._prompt_ids(endpoint, body)
        return block_hashes(ids, self._block_size), len(ids)

    def scorers(self, weights: Weights | None = None) -> list[RequestScorer]:
        """Fresh request-aware scorers for one server set (each set its own prefix index),
        those of weight 0 left out."""
        w = weights or Weights()
        scorers: list[RequestScorer] = [SessionAffinity(weight=w.session)]
        if self._prompt_ids is not None:
            index = KvEventsIndex(self._kv_events) if self._kv_events is not None else None
            scorers.insert(0, PrefixAffinity(index, weight=w.prefix))
        return [s for s in scorers if s.weight]


def session_of(body: dict[str, Any], headers: Mapping[str, str], header: str) -> str | None:
    """The session header's value, else the request's `user`, else none."""
    if value := headers.get(header):
        return value
    user = body.get("user")
    return user if isinstance(user, str) and user else None
