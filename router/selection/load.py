"""Each vLLM server's own load, as its `/metrics` tells it: requests running, requests
waiting for a place in the batch, and the share of the KV cache in use.

    LoadBook               what was last read from each server, and until when it holds
    parse_load(text)       the three figures from Prometheus text (None if it has none)
    ServerLoad(book)       a scorer (`queue`): waiting, running and KV use, weighted

A server's figures hold for a few scrape intervals; older ones, or a server with no
`/metrics`, score 0, so the set ranks it by the gateway's own requests in flight alone.
Each reading keeps how many requests the gateway itself had in flight there when it was
read: the server's requests beyond those are other replicas' and clients' (comparing the
figures with the requests in flight now would count every request that ended since the
reading as someone else's).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
_NAMES = (RUNNING, WAITING, KV_CACHE_USAGE)


@dataclass(frozen=True, slots=True)
class Load:
    """One server's figures, summed over its engines (KV use: the fullest engine's)."""

    running: float
    waiting: float
    kv_cache_usage: float


def parse_load(text: str) -> Load | None:
    """The figures in a `/metrics` body; None if it names none of them. Only their sample
    lines are parsed: a vLLM server's page is mostly histograms the choice does not need."""
    wanted = "\n".join(line for line in text.splitlines() if line.startswith(_NAMES))
    values: dict[str, list[float]] = {name: [] for name in _NAMES}
    try:
        for family in text_string_to_metric_families(wanted):
            for sample in family.samples:
                if sample.name in values:
                    values[sample.name].append(float(sample.value))
    except ValueError:
        return None
    if not any(values.values()):
        return None
    return Load(
        running=sum(values[RUNNING]),
        waiting=sum(values[WAITING]),
        kv_cache_usage=max(values[KV_CACHE_USAGE], default=0.0),
    )


class LoadBook:
    """The latest figures of each server and how long they hold."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._figures: dict[str, tuple[Load, float]] = {}  # url -> (figures, read at)
        self._own: dict[str, int] = {}
        self._valid_s: dict[str, float] = {}

    def record(self, url: str, load: Load | None, *, valid_s: float, own: int = 0) -> None:
        """What `url` reported (None: it has no figures), holding for `valid_s`; `own`: the
        requests the gateway had in flight there when it was read."""
        if load is None:
            self._figures.pop(url, None)
            return
        self._figures[url] = (load, self._clock())
        self._own[url] = own
        self._valid_s[url] = valid_s

    def adopt(self, old: LoadBook, urls: Iterable[str]) -> None:
        """Take over the figures `old` (the book this one replaces on a reload) last read
        from `urls`, as old as they were."""
        for url in urls:
            if (entry := old._figures.get(url)) is not None:
                self._figures[url] = entry
                self._own[url] = old._own[url]
                self._valid_s[url] = old._valid_s[url]

    def fresh(self, url: str) -> Load | None:
        """The figures of `url`, unless there are none or they are too old."""
        entry = self._figures.get(url)
        if entry is None:
            return None
        load, read_at = entry
        if self._clock() - read_at > self._valid_s[url]:
            return None
        return load

    def foreign(self, url: str) -> float:
        """The requests `url` ran or queued when last read beyond the gateway's own then."""
        entry = self._figures.get(url)
        if entry is None:
            return 0.0
        load = entry[0]
        return max(0.0, load.running + load.waiting - self._own[url])

    def snapshot(self, urls: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Each server's figures and their age, for the admin API and metrics."""
        now = self._clock()
        seen: dict[str, dict[str, Any]] = {}
        for url in urls:
            entry = self._figures.get(url)
            if entry is None:
                continue
            load, read_at = entry
            seen[url] = {
                "running": load.running,
                "waiting": load.waiting,
                "own_when_read": self._own[url],
                "kv_cache_usage": load.kv_cache_usage,
                "age_s": round(now - read_at, 3),
                "stale": now - read_at > self._valid_s[url],
            }
        return seen


@dataclass(frozen=True, slots=True)
class LoadWeights:
    foreign: float = 1.0
    """A request the server runs or queues that the gateway did not send it (or not yet
    counts): as one the gateway has in flight."""
    waiting: float = 1.0
    """A waiting request will wait for every running one: it counts once more."""
    kv_cache_usage: float = 4.0
    """A full KV cache (1.0) counts as four running requests: new ones would preempt."""


class ServerLoad:
    """Ranks by what the server's own figures add to what the gateway knows: the requests
    it ran or queued beyond the gateway's own in flight there when read (other replicas'
    and clients'), its waiting requests again, and its KV-cache use. The gateway's own work
    is ranked by `LeastOutstanding` beside it; stale or missing figures score 0."""

    name = "queue"

    def __init__(
        self, book: LoadBook, weights: LoadWeights | None = None, weight: float = 1.0
    ) -> None:
        self.book = book
        self.weights = weights or LoadWeights()
        self.weight = weight

    def score(self, url: str, load: Mapping[str, float], in_flight: Mapping[str, int]) -> float:
        figures = self.book.fresh(url)
        if figures is None:
            return 0.0
        w = self.weights
        return (
            self.book.foreign(url) * w.foreign
            + figures.waiting * w.waiting
            + figures.kv_cache_usage * w.kv_cache_usage
        )

    def others(self, url: str) -> float:
        """Requests `url` runs or queues that are not the gateway's (0 without fresh
        figures)."""
        return self.book.foreign(url) if self.book.fresh(url) is not None else 0.0

    def adopt(self, old: object, urls: Collection[str]) -> None:
        if isinstance(old, ServerLoad):
            self.book.adopt(old.book, urls)
