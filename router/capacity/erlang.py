"""How many single-slot servers a stream of requests needs: the Erlang C queue (M/M/c).

Requests arrive at random (Poisson, rate λ) and each holds one server for a time with mean
S; `offered` = λ·S is the load in Erlangs (the servers the load keeps busy on average). With
`servers` of them, the share of requests that must wait at all is Erlang's C formula, and
the share that waits longer than t is C·exp(-(servers - offered)·t/S). Where arrivals are
burstier than Poisson, more wait than this says; where hold times vary less than an
exponential's, fewer.
"""

from __future__ import annotations

import math

MAX_SERVERS = 10_000
"""The most servers an answer names: beyond it the load is no pool's (and the search, linear
in the servers, stays bounded)."""


def waiting_share(servers: int, offered: float) -> float:
    """Erlang's C: the share of requests that find every server busy and wait (1 when the
    servers cannot keep up: `offered` >= `servers`)."""
    if offered <= 0:
        return 0.0
    if servers <= offered:
        return 1.0
    blocked = _erlang_b(servers, offered)
    return servers * blocked / (servers - offered * (1.0 - blocked))


def share_waiting_longer(servers: int, offered: float, *, wait_s: float, hold_s: float) -> float:
    """The share of requests that wait longer than `wait_s` for a server."""
    share = waiting_share(servers, offered)
    if share >= 1.0 or share == 0.0:
        return share
    return share * math.exp(-(servers - offered) * wait_s / hold_s)


def servers_needed(offered: float, *, hold_s: float, wait_s: float, share: float) -> int:
    """The fewest servers with which at most `share` of the requests wait longer than
    `wait_s` (0 for no load; at most `MAX_SERVERS`). Linear in the answer: Erlang's B is
    carried from one count of servers to the next."""
    if offered <= 0:
        return 0
    if not math.isfinite(offered) or offered >= MAX_SERVERS:
        return MAX_SERVERS
    blocked = 1.0
    for servers in range(1, MAX_SERVERS + 1):
        blocked = offered * blocked / (servers + offered * blocked)
        if servers <= offered:
            continue  # fewer than the load keeps busy cannot keep up at all
        waits = servers * blocked / (servers - offered * (1.0 - blocked))
        if waits * math.exp(-(servers - offered) * wait_s / hold_s) <= share:
            return servers
    return MAX_SERVERS


def _erlang_b(servers: int, offered: float) -> float:
    """Erlang's B (the share of requests a loss system turns away), by its recurrence: stable
    for any number of servers, linear in them."""
    blocked = 1.0
    for k in range(1, servers + 1):
        blocked = offered * blocked / (k + offered * blocked)
    return blocked
