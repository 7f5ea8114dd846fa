"""`GET /v1/models`: each served model as its vLLM servers describe it.

vLLM's model object carries what clients read besides the id (`max_model_len`, `root`,
`permission`, ...). For each model the gateway asks the vLLM servers its configuration
names (the throughput path's, then the latency pools' prefill servers), one after the
other, and takes the first object one of them returns, under the gateway's model name.
Answers, and the lack of one, are kept for `TTL_S`; concurrent askers share one lookup.
When no server answers, the model is described by what the gateway knows (`fallback_card`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.config import ModelConfig, ProxyConfig, PullConfig
from router.errors import UpstreamError
from router.upstream import vllm
from router.upstream.client import Upstreams

log = logging.getLogger("pd_gateway")

TTL_S = 10.0
"""How long a model's card (or the finding that no server answered) is reused."""
LOOKUP_S = 3.0
"""The most one model's lookup may take, over all its servers."""
MAX_SERVERS = 4
"""Servers asked per lookup: replicas of one model describe it alike."""


def card_servers(model: ModelConfig) -> list[str]:
    """The vLLM servers that describe `model`, each once: the throughput path's first."""
    urls: list[str] = []
    throughput = model.throughput
    if isinstance(throughput, ProxyConfig):
        urls += throughput.urls
    elif isinstance(throughput, PullConfig):
        urls += [*throughput.decode, *throughput.prefill]
    elif throughput is not None:
        urls += [*throughput.decode, *(engine.url for engine in throughput.prefill)]
    if model.latency is not None:
        urls += model.latency.prefill
    return list(dict.fromkeys(urls))


def fallback_card(name: str, created: int) -> dict[str, Any]:
    """What the gateway says of a model no server described: its name, served by vLLM."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": name,
        "parent": None,
    }


def pick_card(listing: Any, name: str) -> dict[str, Any] | None:
    """The base model's object in a vLLM `/v1/models` answer, renamed `name`: the entry of
    that name, else the first that is no adapter (no `parent`). None for another shape."""
    data = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(data, list):
        return None
    cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]
    chosen = next((c for c in cards if c["id"] == name), None)
    if chosen is None:
        chosen = next((c for c in cards if c.get("parent") is None), None)
    return None if chosen is None else {**chosen, "id": name}


@dataclass(slots=True)
class _Kept:
    card: dict[str, Any] | None
    servers: tuple[str, ...]
    until: float


class ModelCards:
    def __init__(
        self,
        upstreams: Upstreams,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._upstreams = upstreams
        self._clock = clock
        self._created = int(wall_clock())
        self._kept: dict[str, _Kept] = {}
        self._lookups: dict[str, asyncio.Future[dict[str, Any] | None]] = {}

    async def cards(self, models: list[ModelConfig]) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(self.card(m) for m in models)))

    async def card(self, model: ModelConfig) -> dict[str, Any]:
        servers = tuple(card_servers(model)[:MAX_SERVERS])
        kept = self._kept.get(model.name)
        if kept is None or kept.servers != servers or kept.until <= self._clock():
            found = await self._shared_lookup(model.name, servers)
        else:
            found = kept.card
        return found if found is not None else fallback_card(model.name, self._created)

    async def _shared_lookup(self, name: str, servers: tuple[str, ...]) -> dict[str, Any] | None:
        lookup = self._lookups.get(name)
        if lookup is None:
            lookup = self._lookups[name] = asyncio.ensure_future(self._lookup(name, servers))
        # Shielded: an asker that leaves does not cancel the lookup the others wait for.
        return await asyncio.shield(lookup)

    async def _lookup(self, name: str, servers: tuple[str, ...]) -> dict[str, Any] | None:
        card = None
        try:
            async with asyncio.timeout(LOOKUP_S):
                for base in servers:
                    card = await self._ask(base, name)
                    if card is not None:
                        break
        except TimeoutError:
            log.debug("no model list for %s within %s s", name, LOOKUP_S)
        finally:
            del self._lookups[name]
        self._kept[name] = _Kept(card, servers, self._clock() + TTL_S)
        return card

    async def _ask(self, base: str, name: str) -> dict[str, Any] | None:
        try:
            reply = await self._upstreams.call(
                vllm.MODELS, "GET", base, "/v1/models", read_s=LOOKUP_S
            )
        except UpstreamError as exc:
            log.debug("no model list from %s: %s", base, exc.message)
            return None
        if reply.status != 200:
            log.debug("no model list from %s: status %s", base, reply.status)
            return None
        return pick_card(await reply.json(), name)
