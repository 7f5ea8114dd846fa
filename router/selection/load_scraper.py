"""Reading the vLLM servers' load: every interval, each server of every set is asked
`GET /metrics`, once however many sets name it; the sets' load books hear the figures.

Figures hold for `STALE_AFTER_INTERVALS` intervals: a server that stops answering is ranked
by the gateway's own requests in flight once they have aged out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from router.errors import UpstreamError
from router.selection.load import Load, LoadBook, ServerLoad
from router.selection.server_set import ServerSet

log = logging.getLogger("pd_gateway.load")

STALE_AFTER_INTERVALS = 3


def load_books(sets: Iterable[ServerSet]) -> list[tuple[ServerSet, LoadBook]]:
    """The sets that rank by load, each with its book."""
    found = []
    for servers in sets:
        for scorer in servers.scorers:
            if isinstance(scorer, ServerLoad):
                found.append((servers, scorer.book))
    return found


async def scrape_once(
    sets: Iterable[ServerSet],
    read: Callable[[str], Awaitable[Load | None]],
    *,
    interval_s: float,
) -> dict[str, Load | None]:
    """Read every server of `sets` that ranks by load once; what each reported, by URL (a
    server that did not answer, `read` raising UpstreamError, is left out: its last
    figures age). `read` gives None for a server without figures."""
    sets = list(sets)
    books = load_books(sets)
    urls = list(dict.fromkeys(url for servers, _ in books for url in servers.urls))
    own: dict[str, int] = {}

    async def reading(url: str) -> Load | UpstreamError | None:
        before = own_in_flight(sets, url)
        try:
            return await read(url)
        except UpstreamError as exc:
            return exc
        finally:
            # The server counted its requests somewhere between the two: the larger count
            # never takes one of the gateway's own for someone else's.
            own[url] = max(before, own_in_flight(sets, url))

    answers = dict(zip(urls, await asyncio.gather(*map(reading, urls)), strict=True))
    valid_s = STALE_AFTER_INTERVALS * interval_s
    read_now: dict[str, Load | None] = {}
    for url, answer in answers.items():
        if not isinstance(answer, UpstreamError):
            read_now[url] = answer
    for servers, book in books:
        for url in servers.urls:
            if url in read_now:
                book.record(url, read_now[url], valid_s=valid_s, own=own[url])
    return read_now


def own_in_flight(sets: Iterable[ServerSet], url: str) -> int:
    """The gateway's requests in flight on `url`, over every set that names it."""
    return sum(servers.outstanding().get(url, 0) for servers in sets)


async def scrape_forever(
    sets: Callable[[], Iterable[ServerSet]],
    read: Callable[[str], Awaitable[Load | None]],
    *,
    interval_s: float,
) -> None:
    """Run until cancelled; `sets` is asked each round (a reload replaces them)."""
    while True:
        try:
            await scrape_once(sets(), read, interval_s=interval_s)
        except Exception:  # nothing may end the scraper: the figures would go stale
            log.exception("reading the vLLM servers' load failed")
        await asyncio.sleep(interval_s)


def load_snapshot(servers: ServerSet) -> dict[str, dict[str, Any]]:
    """The figures last read from each server of `servers` (none if it does not rank by
    load, or nothing was read yet)."""
    figures: dict[str, dict[str, Any]] = {}
    for _, book in load_books([servers]):
        figures.update(book.snapshot(servers.urls))
    return figures
