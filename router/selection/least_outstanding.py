"""Least-outstanding-requests choice among equivalent upstream servers."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager


class LeastOutstanding:
    """Picks the server with the fewest requests in flight; ties rotate."""

    def __init__(self, urls: list[str]) -> None:
        if not urls:
            raise ValueError("at least one upstream URL is needed")
        self._outstanding = dict.fromkeys(urls, 0)
        self._turn = itertools.count()

    def pick(self) -> str:
        urls = list(self._outstanding)
        start = next(self._turn) % len(urls)
        rotated = urls[start:] + urls[:start]
        return min(rotated, key=self._outstanding.__getitem__)

    @contextmanager
    def hold(self, url: str) -> Iterator[str]:
        self._outstanding[url] += 1
        try:
            yield url
        finally:
            self._outstanding[url] -= 1

    def outstanding(self) -> dict[str, int]:
        return dict(self._outstanding)
