"""Passive outlier ejection: each server judged by the outcomes of the calls made to it.

    healthy ──N consecutive failures──▶ ejected (back-off: base, doubling, capped)
       ▲                                    │ back-off over
       │ a success                          ▼
       └────────────────────────────── on probation: one more failure ejects it again,
                                        for twice as long

A failure is a call that did not get an answer from the server (refused, unreachable, timed
out, broken off) or an answer with a 5xx status; a 4xx is an answer about the request, and
counts as a success. Ejection never takes out more than `max_ejected_share` of a set, and
never its last eligible server: a set whose servers all fail keeps trying the least bad.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from router.errors import UpstreamError

Outcome = Literal["ok", "unreachable", "timeout", "error", "probe_failed"]
"""What one call said about its server; all but `ok` count as failures."""

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class EjectionPolicy:
    consecutive_failures: int = 5
    """Failures in a row that eject a server."""
    base_ejection_s: float = 10.0
    """The first ejection's length; each ejection in a row doubles it."""
    max_ejection_s: float = 300.0
    max_ejected_share: float = 0.5
    """At most this share of a set is ejected at once (rounded down), and never all."""


def outcome_of(exc: BaseException) -> Outcome | None:
    """What a failed call says about its server; None when it says nothing (the client left,
    the gateway was cancelled, or the error is not the server's)."""
    if not isinstance(exc, UpstreamError):
        return None
    code = str(exc.code or "")
    if code.endswith("_unreachable"):
        return "unreachable"
    if code.endswith("_timeout"):
        return "timeout"
    if exc.status >= 500:
        return "error"
    return "ok"  # the server answered, about the request


def status_outcome(status: int) -> Outcome:
    """What an answer's status says about its server."""
    return "error" if status >= 500 else "ok"


@dataclass(slots=True)
class ServerHealth:
    """One server's record."""

    consecutive_failures: int = 0
    ejections_in_a_row: int = 0
    ejected_until: float | None = None
    failures: int = 0
    ejections: int = 0
    last_failure: Outcome | None = None


class HealthBook:
    """The health of one set of equivalent servers."""

    def __init__(
        self,
        urls: Iterable[str],
        policy: EjectionPolicy | None = None,
        *,
        clock: Clock = time.monotonic,
        on_ejected: Callable[[str], None] | None = None,
    ) -> None:
        self.policy = policy or EjectionPolicy()
        self._clock = clock
        self._servers = {url: ServerHealth() for url in urls}
        self._on_ejected = on_ejected

    def eligible(self, url: str) -> bool:
        until = self._servers[url].ejected_until
        return until is None or self._clock() >= until

    def state(self, url: str) -> Literal["healthy", "failing", "ejected", "probation"]:
        server = self._servers[url]
        if server.ejected_until is not None:
            return "probation" if self.eligible(url) else "ejected"
        return "failing" if server.consecutive_failures else "healthy"

    def report(self, url: str, outcome: Outcome) -> None:
        server = self._servers.get(url)
        if server is None:
            return
        if outcome == "ok":
            server.consecutive_failures = 0
            server.ejections_in_a_row = 0
            server.ejected_until = None
            return
        server.failures += 1
        server.last_failure = outcome
        if not self.eligible(url):
            return  # already out: a late answer or a probe does not lengthen its back-off
        server.consecutive_failures += 1
        on_probation = server.ejected_until is not None and self.eligible(url)
        if on_probation or server.consecutive_failures >= self.policy.consecutive_failures:
            self._eject(url, server)

    def adopt(self, old: HealthBook) -> None:
        """Take over the record `old`, the book this one replaces on a reload, keeps of each
        server both hold: its failures, ejection and back-off go on, and a call still in
        flight in the old set reports to the same record. A server `old` does not hold
        keeps its fresh record."""
        for url in self._servers:
            if (record := old._servers.get(url)) is not None:
                self._servers[url] = record

    def readmit(self, url: str) -> None:
        """A probe found the server answering: eligible now, still on probation."""
        server = self._servers.get(url)
        if server is not None and server.ejected_until is not None:
            server.ejected_until = min(server.ejected_until, self._clock())

    def _eject(self, url: str, server: ServerHealth) -> None:
        if self._ejected_count() >= self._max_ejected():
            return  # stays eligible: the set must keep enough servers to try
        policy = self.policy
        length = policy.base_ejection_s * 2 ** min(server.ejections_in_a_row, 30)
        server.ejected_until = self._clock() + min(length, policy.max_ejection_s)
        server.ejections_in_a_row += 1
        server.ejections += 1
        server.consecutive_failures = 0
        if self._on_ejected is not None:
            self._on_ejected(url)

    def _ejected_count(self) -> int:
        return sum(1 for url in self._servers if not self.eligible(url))

    def _max_ejected(self) -> int:
        total = len(self._servers)
        return min(total - 1, math.floor(total * self.policy.max_ejected_share))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        now = self._clock()
        return {
            url: {
                "state": self.state(url),
                "consecutive_failures": server.consecutive_failures,
                "ejected_for_s": (
                    round(server.ejected_until - now, 3)
                    if server.ejected_until is not None and server.ejected_until > now
                    else 0.0
                ),
                "failures": server.failures,
                "ejections": server.ejections,
                "last_failure": server.last_failure,
            }
            for url, server in self._servers.items()
        }
