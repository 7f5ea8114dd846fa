"""Active probes: every interval, each server of every set is asked whether it is alive,
once however many sets name it; the sets' health books hear the answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from router.selection.server_set import ServerSet

log = logging.getLogger("pd_gateway.health")


async def probe_servers_once(
    sets: Iterable[ServerSet], answers: Callable[[str], Awaitable[bool]]
) -> dict[str, bool]:
    """Probe every server of `sets` once; what each answered, by URL."""
    sets = list(sets)
    urls = list(dict.fromkeys(url for s in sets for url in s.urls))
    results = dict(zip(urls, await asyncio.gather(*(answers(url) for url in urls)), strict=True))
    for servers in sets:
        for url in servers.urls:
            servers.probed(url, answered=results[url])
    return results


async def probe_servers_forever(
    sets: Callable[[], Iterable[ServerSet]],
    answers: Callable[[str], Awaitable[bool]],
    *,
    interval_s: float,
) -> None:
    """Run until cancelled; `sets` is asked each round (a reload replaces them)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await probe_servers_once(sets(), answers)
        except Exception:  # nothing may end the prober: ejected servers would wait it out
            log.exception("probing the vLLM servers failed")
