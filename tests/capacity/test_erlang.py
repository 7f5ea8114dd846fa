"""Erlang's formulas against their textbook form and against a simulated queue: the share of
requests that wait (and wait longer than a bound) that a pool of single-slot servers gives,
and the fewest servers that meet a target."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from router.capacity.erlang import (
    MAX_SERVERS,
    servers_needed,
    share_waiting_longer,
    waiting_share,
)


def textbook_erlang_c(servers: int, offered: float) -> float:
    """C(c, a) = (a^c/c! · c/(c-a)) / (Σ_{k<c} a^k/k! + a^c/c! · c/(c-a))."""
    top = offered**servers / math.factorial(servers) * servers / (servers - offered)
    return top / (sum(offered**k / math.factorial(k) for k in range(servers)) + top)


@pytest.mark.parametrize(("servers", "offered"), [(1, 0.5), (2, 1.0), (8, 6.3), (30, 24.0)])
def test_the_waiting_share_is_erlangs_c(servers: int, offered: float) -> None:
    assert waiting_share(servers, offered) == pytest.approx(textbook_erlang_c(servers, offered))


def test_one_server_makes_a_request_wait_as_often_as_it_is_busy() -> None:
    assert waiting_share(1, 0.3) == pytest.approx(0.3)


def test_servers_that_cannot_keep_up_make_everyone_wait() -> None:
    assert waiting_share(4, 4.0) == 1.0
    assert waiting_share(4, 9.0) == 1.0
    assert waiting_share(4, 0.0) == 0.0


def simulated_share_waiting_longer(
    servers: int, arrivals_per_s: float, hold_s: float, wait_s: float, requests: int
) -> float:
    """A first-come-first-served queue of `servers` with Poisson arrivals and exponential
    holds, run for `requests` arrivals: the share that waited longer than `wait_s`."""
    rng = random.Random(11)
    free_at = [0.0] * servers  # when each server is next free
    heapq.heapify(free_at)
    now, longer = 0.0, 0
    for _ in range(requests):
        now += rng.expovariate(arrivals_per_s)
        start = max(now, heapq.heappop(free_at))
        longer += start - now > wait_s
        heapq.heappush(free_at, start + rng.expovariate(1 / hold_s))
    return longer / requests


def test_the_predicted_share_waiting_longer_is_what_a_simulated_queue_shows() -> None:
    servers, arrivals_per_s, hold_s, wait_s = 6, 2.0, 2.4, 0.5  # 4.8 Erlangs on 6 nodes
    predicted = share_waiting_longer(servers, arrivals_per_s * hold_s, wait_s=wait_s, hold_s=hold_s)
    simulated = simulated_share_waiting_longer(servers, arrivals_per_s, hold_s, wait_s, 200_000)
    assert 0.2 < predicted < 0.5
    assert simulated == pytest.approx(predicted, abs=0.02)


def test_the_servers_needed_are_the_fewest_that_meet_the_target() -> None:
    offered, hold_s, wait_s, share = 4.8, 2.4, 0.5, 0.05
    needed = servers_needed(offered, hold_s=hold_s, wait_s=wait_s, share=share)
    assert share_waiting_longer(needed, offered, wait_s=wait_s, hold_s=hold_s) <= share
    assert share_waiting_longer(needed - 1, offered, wait_s=wait_s, hold_s=hold_s) > share
    assert needed == 9


def test_no_load_needs_no_server_and_any_load_needs_more_servers_than_it_keeps_busy() -> None:
    assert servers_needed(0.0, hold_s=1, wait_s=1, share=0.05) == 0
    # A generous target: keeping up is all it takes.
    assert servers_needed(3.0, hold_s=1, wait_s=3600, share=0.5) == 4
    assert servers_needed(0.01, hold_s=1, wait_s=3600, share=0.5) == 1


def test_more_load_or_a_stricter_target_never_needs_fewer_servers() -> None:
    needs = [servers_needed(a / 4, hold_s=2, wait_s=0.5, share=0.05) for a in range(200)]
    assert needs == sorted(needs)
    strict = [servers_needed(20, hold_s=2, wait_s=0.5, share=s) for s in (0.5, 0.2, 0.05, 0.01)]
    assert strict == sorted(strict)


def test_a_load_beyond_any_pool_is_answered_at_once_with_the_bound() -> None:
    assert servers_needed(math.inf, hold_s=1, wait_s=1, share=0.05) == MAX_SERVERS
    assert servers_needed(2e6, hold_s=1, wait_s=1, share=0.05) == MAX_SERVERS
    # Large pools stay exact (the recurrence is stable where factorials overflow).
    assert 9_000 < servers_needed(9_000, hold_s=2, wait_s=0.2, share=0.05) < 9_100
