"""Active probes: every interval, each server of every set is asked whether it is alive,
once however many sets name it; the sets' health books hear the answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, runtime_checkable

from router.selection.server_set import ServerSet

log = logging.getLogger("pd_gateway.health")


@runtime_checkable
class ServedBy(Protocol):
    """A path that chooses among servers: its sets, for probes, metrics and the admin API."""

    def server_sets(self) -> list[ServerSet]: ...


def sets_of(paths: Iterable[object]) -> list[ServerSet]:
    """The server sets of `paths`, each once."""
    found: list[ServerSet] = []
    for path in paths:
        if isinstance(path, ServedBy):
            found += [s for s in path.server_sets() if s not in found]
    return found


async def probe_once(
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


async def probe_forever(
    sets: Callable[[], Iterable[ServerSet]],
    answers: Callable[[str], Awaitable[bool]],
    *,
    interval_s: float,
) -> None:
    """Run until cancelled; `sets` is asked each round (a reload replaces them)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await probe_once(sets(), answers)
        except Exception:  # nothing may end the prober: ejected servers would wait it out
            log.exception("probing the vLLM servers failed")
