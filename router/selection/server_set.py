"""Choosing among equivalent servers: filters narrow the set, scorers rank what is left, the
picker takes the best (ties rotate). Every choice says why it was made.

    ServerSet(urls, filters=[Healthy(book)], scorers=[LeastOutstanding()], health=book)
      .pick()          -> Choice(url, reason)
      .hold(url)       counts a request in flight for as long as it runs
      .report(url, o)  tells the health book how a call went
      .adopt(old)      on a reload: takes over what the set it replaces learned

Reasons: `only_server` (a set of one), `only_<filter>` (the filters left one server, e.g.
`only_healthy`), the name of the scorer that separated the winner from the runner-up
(`load`), `rotation` (a tie, taken in turn), `none_<filter>` (the filters left nothing, so
every server was a candidate); a retry's reason is `retry_` and the reason it was chosen
(`retry_only_other` when one other server was left).

Request-aware scorers (`RequestScorer`, router/selection/affinity.py) also see what the
request offers (`Affinity`: its prompt's blocks and length, its session) when `pick` is
given it, and are told where it was sent by `hold`; their reason may carry detail
(`prefix:12 blocks`).

Load is what each server has in flight from this set. For a request of known length it is
counted in units of that request: the tokens the requests in flight there had left to
compute when sent (their uncached part), divided by this request's tokens, plus one for
each request of unknown length. A server's total is then the work ahead of the request
there plus its own uncached share: lowest, soonest started.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from router.selection.affinity import Affinity
from router.selection.ejection import HealthBook, Outcome
from router.selection.load import LoadBook, ServerLoad


@dataclass(frozen=True, slots=True)
class Choice:
    url: str
    reason: str

    def header(self) -> str:
        """The `x-pd-upstream` header's value."""
        return f"{self.url}; reason={self.reason}"


class Filter(Protocol):
    name: str

    def keep(self, url: str) -> bool: ...


class Scorer(Protocol):
    name: str
    weight: float

    def score(self, url: str, load: Mapping[str, float], in_flight: Mapping[str, int]) -> float:
        """Lower is better. `load`: the work in flight in units of the request (see the
        module); `in_flight`: the requests in flight, counted."""
        ...


class RequestScorer(Protocol):
    """A scorer that ranks by what the request offers; it only takes part when given one."""

    name: str
    weight: float

    def score(self, url: str, load: Mapping[str, float], request: Affinity) -> float:
        """Lower is better."""
        ...

    def cached_tokens(self, url: str, request: Affinity) -> int:
        """How many of the request's tokens `url` is believed to hold already."""
        ...

    def reason(self, url: str, request: Affinity) -> str:
        """Why `url` won when this scorer separated it from the runner-up."""
        ...

    def sent(self, url: str, request: Affinity) -> None:
        """The request was sent to `url`."""
        ...


@runtime_checkable
class Foreign(Protocol):
    """A scorer that knows of a server's requests beyond the gateway's own."""

    def others(self, url: str) -> float: ...


@runtime_checkable
class Learning(Protocol):
    """A scorer that learns about each server as it goes (load figures, a prefix index)."""

    name: str

    def adopt(self, old: object, urls: Collection[str]) -> None:
        """Take over what `old`, the scorer this one replaces on a reload, learned of
        `urls`, if it is a scorer of the same kind."""
        ...


class Healthy:
    """Keeps the servers the health book does not eject."""

    name = "healthy"

    def __init__(self, book: HealthBook) -> None:
        self._book = book

    def keep(self, url: str) -> bool:
        return self._book.eligible(url)


class LeastOutstanding:
    """Ranks by the work in flight (see the module's description of load)."""

    name = "load"

    def __init__(self, weight: float = 1.0) -> None:
        self.weight = weight

    def score(self, url: str, load: Mapping[str, float], in_flight: Mapping[str, int]) -> float:
        return load[url]


class RandomOrder:
    """A random score in [0, 1): alone, a uniformly random choice; beside others, noise."""

    name = "random"

    def __init__(self, weight: float = 1.0, rng: random.Random | None = None) -> None:
        self.weight = weight
        self._rng = rng or random.Random()

    def score(self, url: str, load: Mapping[str, float], in_flight: Mapping[str, int]) -> float:
        return self._rng.random()


class ServerSet:
    """Equivalent servers (one leg of one path) and the requests each has in flight."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        filters: Sequence[Filter] = (),
        scorers: Sequence[Scorer] = (),
        request_scorers: Sequence[RequestScorer] = (),
        health: HealthBook | None = None,
        name: str = "",
    ) -> None:
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        self.name = name
        self.health = health
        self._urls = list(dict.fromkeys(urls))
        self._filters = list(filters)
        self._scorers = list(scorers)
        self._foreign = [s for s in self._scorers if isinstance(s, Foreign)]
        self._request_scorers = list(request_scorers)
        self._outstanding = dict.fromkeys(self._urls, 0)
        self._unsized = dict.fromkeys(self._urls, 0)  # in flight, length unknown
        self._work = dict.fromkeys(self._urls, 0)  # in flight: uncached tokens when sent
        self._turn = itertools.count()

    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    @property
    def request_aware(self) -> bool:
        """Whether a request's `Affinity` would change a choice (worth computing it)."""
        return bool(self._request_scorers) and len(self._urls) > 1

    def pick(self, exclude: Collection[str] = (), request: Affinity | None = None) -> Choice:
        """The best server not in `exclude` (all of them if that leaves none)."""
        candidates = [url for url in self._urls if url not in exclude] or list(self._urls)
        prefix = "retry_" if exclude else ""
        if len(self._urls) == 1:
            return Choice(candidates[0], "only_server")
        if exclude and len(candidates) == 1:
            return Choice(candidates[0], "retry_only_other")
        for kept_filter in self._filters:
            kept = [url for url in candidates if kept_filter.keep(url)]
            if not kept:
                prefix += f"none_{kept_filter.name}_"
                continue  # a filter that leaves nothing is ignored
            if len(kept) == 1:
                return Choice(kept[0], f"{prefix}only_{kept_filter.name}")
            candidates = kept
        start = next(self._turn) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        # Scorers compare the candidates only: an excluded or ejected server's load is no
        # measure of balance.
        load = self._load(rotated, request)
        scores = {url: self._scores(url, load, request) for url in rotated}
        totals = {url: sum(margin for margin, _ in scores[url]) for url in rotated}
        best = min(rotated, key=totals.__getitem__)
        runners_up = [url for url in rotated if url != best]
        return Choice(best, prefix + self._why(best, runners_up, totals, scores, request))

    def _load(self, urls: list[str], request: Affinity | None) -> dict[str, float]:
        if request is None or not request.tokens:
            return {url: float(self._outstanding[url]) for url in urls}
        return {url: self._unsized[url] + self._work[url] / request.tokens for url in urls}

    def _scores(
        self, url: str, load: Mapping[str, float], request: Affinity | None
    ) -> list[tuple[float, int]]:
        """Each scorer's weighted score and its position (plain scorers first)."""
        scores = [s.weight * s.score(url, load, self._outstanding) for s in self._scorers]
        if request is not None:
            scores += [s.weight * s.score(url, load, request) for s in self._request_scorers]
        return [(score, i) for i, score in enumerate(scores)]

    def _why(
        self,
        best: str,
        others: list[str],
        totals: Mapping[str, float],
        scores: Mapping[str, list[tuple[float, int]]],
        request: Affinity | None,
    ) -> str:
        if not others or any(totals[url] == totals[best] for url in others):
            return "rotation"
        runner_up = min(others, key=totals.__getitem__)
        margins = [
            (theirs - ours, i)
            for (ours, i), (theirs, _) in zip(scores[best], scores[runner_up], strict=True)
        ]
        decider = max(margins)[1]
        if decider < len(self._scorers):
            return self._scorers[decider].name
        assert request is not None
        return self._request_scorers[decider - len(self._scorers)].reason(best, request)

    def cached_tokens(self, url: str, request: Affinity) -> int:
        """How much of the request's prompt `url` is expected to hold (0 without a prefix
        index)."""
        return max((s.cached_tokens(url, request) for s in self._request_scorers), default=0)

    def least_outstanding(self) -> int:
        """Requests in flight on the least busy server of the set."""
        return min(self._outstanding.values())

    @contextmanager
    def hold(self, url: str, request: Affinity | None = None) -> Iterator[str]:
        """Counts a request in flight on `url` while held; `request` is remembered as sent
        there."""
        work = None
        if request is not None:
            if request.tokens:
                work = request.tokens - self.cached_tokens(url, request)
            for scorer in self._request_scorers:
                scorer.sent(url, request)
        self._outstanding[url] += 1
        if work is None:
            self._unsized[url] += 1
        else:
            self._work[url] += work
        try:
            yield url
        finally:
            self._outstanding[url] -= 1
            if work is None:
                self._unsized[url] -= 1
            else:
                self._work[url] -= work

    def adopt(self, old: ServerSet) -> None:
        """Take over what `old`, the set this one replaces on a reload, learned of the
        servers both name: their health record (shared with `old` from now on, so a call
        still in flight there reports to it), and what each learning scorer knows (load
        figures, a prefix index), from `old`'s scorer of the same name. A server `old`
        did not name starts fresh; requests in flight stay counted where they were held."""
        urls = [url for url in self._urls if url in old._outstanding]
        if self.health is not None and old.health is not None:
            self.health.adopt(old.health)
        theirs: dict[str, Scorer | RequestScorer] = {s.name: s for s in old._scorers}
        theirs.update((s.name, s) for s in old._request_scorers)
        mine: list[Scorer | RequestScorer] = [*self._scorers, *self._request_scorers]
        for scorer in mine:
            if isinstance(scorer, Learning) and scorer.name in theirs:
                scorer.adopt(theirs[scorer.name], urls)

    def report(self, url: str, outcome: Outcome) -> None:
        if self.health is not None:
            self.health.report(url, outcome)

    def probed(self, url: str, *, answered: bool) -> None:
        """An active probe's result: a failure counts as a failed call; an answer lets an
        ejected server back early, on probation (requests, not probes, prove it healthy)."""
        if self.health is None:
            return
        if answered:
            self.health.readmit(url)
        else:
            self.health.report(url, "probe_failed")

    def outstanding(self) -> dict[str, int]:
        return dict(self._outstanding)

    def still(self, choice: Choice | None) -> Choice | None:
        """`choice`, made a while ago, if the set would still consider its server (healthy:
        not ejected since); None otherwise, for the caller to choose again."""
        if choice is None or choice.url not in self._outstanding:
            return None
        return choice if all(f.keep(choice.url) for f in self._filters) else None

    def running(self, url: str) -> int:
        """Requests `url` is serving: the gateway's in flight there, and where the server's
        own figures are fresh, those of other replicas and clients (0 for a server not of
        the set)."""
        others = max((s.others(url) for s in self._foreign), default=0.0)
        return self._outstanding.get(url, 0) + round(others)

    def snapshot(self) -> dict[str, Any]:
        """Each server's requests in flight and health, for the admin API and metrics."""
        health = self.health.snapshot() if self.health is not None else {}
        return {
            url: {"outstanding": self._outstanding[url], **health.get(url, {"state": "healthy"})}
            for url in self._urls
        }

    @property
    def scorers(self) -> list[Scorer]:
        return list(self._scorers)


@dataclass(frozen=True, slots=True)
class Weights:
    """Each scorer's weight; 0 leaves it out."""

    load: float = 1.0
    queue: float = 1.0
    prefix: float = 2.0
    session: float = 0.5
    random: float = 0.0


def default_set(
    urls: Sequence[str],
    *,
    name: str = "",
    health: HealthBook | None = None,
    request_scorers: Sequence[RequestScorer] = (),
    load: LoadBook | None = None,
    weights: Weights | None = None,
) -> ServerSet:
    """The default composition: healthy servers only, the least busy first, busy as the
    gateway's own requests in flight and the server's own queue and KV use (`load`: the
    figures read from its `/metrics`) tell it; then what `request_scorers` add, for a
    request that offers them something (weighted by their maker)."""
    w = weights or Weights()
    book = health or HealthBook(urls)
    scorers: list[Scorer] = [
        LeastOutstanding(w.load),
        ServerLoad(load or LoadBook(), weight=w.queue),
        RandomOrder(w.random),
    ]
    return ServerSet(
        urls,
        filters=[Healthy(book)],
        scorers=[s for s in scorers if s.weight],
        request_scorers=[s for s in request_scorers if s.weight],
        health=book,
        name=name,
    )
