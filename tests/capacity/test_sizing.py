"""One model's pools sized from its load: TileRT nodes for the queue target from the pool's
state, prefill servers from the prefill work its answers report, native decode servers from
the requests running and the measured gap line."""

from __future__ import annotations

import pytest

from router.capacity import Sizer
from router.capacity.erlang import servers_needed
from router.config import ObjectivesConfig, SizingConfig
from router.gate import GateSnapshot
from router.objectives import Timings
from router.telemetry.access import AccessRecord


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def snapshot(*, nodes: int, busy: int, waiting: int, out: int = 0, hold_s: float) -> GateSnapshot:
    holders = {f"n{i}": (f"r{i}" if i < busy else None) for i in range(nodes)}
    down = {f"n{nodes - 1 - i}": "unhealthy" for i in range(out)}
    return GateSnapshot(nodes, holders, down, waiting, retry_after_s=1, hold_s=hold_s)


def prefilled(tokens: int | None, prompt_tokens: int = 0) -> AccessRecord:
    access = AccessRecord(request_id="r")
    access.prefill = "http://prefill:8000"
    access.prompt_tokens = prompt_tokens
    access.prefilled(0.05, tokens)
    return access


def test_the_tilert_pool_is_sized_for_its_offered_load_and_the_queue_target() -> None:
    clock = Clock()
    config = SizingConfig(tilert_wait_ms=500, tilert_wait_share=0.05)
    sizer = Sizer(config, clock)
    for second in range(0, 600, 2):
        clock.now = second
        sizer.read_pool(snapshot(nodes=8, busy=4, waiting=1, out=1, hold_s=3.0))
    [tilert] = sizer.sizes(Timings(ObjectivesConfig()), tilert=True)
    assert tilert.pool == "tilert"
    assert tilert.current == 7  # one of eight out of service
    assert tilert.demand == pytest.approx(5.0)
    assert tilert.recommended == servers_needed(5.0, hold_s=3.0, wait_s=0.5, share=0.05)
    assert tilert.basis["arrivals_per_s"] == pytest.approx(5 / 3, rel=1e-3)


def test_an_idle_pool_needs_no_node_and_a_pool_not_read_yet_recommends_nothing() -> None:
    clock = Clock()
    sizer = Sizer(SizingConfig(), clock)
    timings = Timings(ObjectivesConfig())
    assert sizer.sizes(timings, tilert=True) == []
    sizer.read_pool(snapshot(nodes=4, busy=0, waiting=0, hold_s=2.0))
    [tilert] = sizer.sizes(timings, tilert=True)
    assert (tilert.demand, tilert.recommended) == (0.0, 0)


def test_prefill_servers_are_the_prefill_work_over_the_utilization_target() -> None:
    clock = Clock()
    sizer = Sizer(SizingConfig(prefill_utilization=0.5), clock)
    timings = Timings(ObjectivesConfig(prefill_ms_per_token=0.5, prefill_base_ms=100))
    urls = ["http://prefill:8000", "http://prefill-2:8000"]
    for second in range(0, 301):
        clock.now = second
        for _ in range(4):  # 4 prefills of 1000 computed tokens a second
            sizer.answered(prefilled(1000))
        sizer.read_servers(prefill=urls, decode=[], outstanding={})
    [prefill] = sizer.sizes(timings, tilert=False)
    # 4000 tokens/s x 0.5 ms + 4/s x 100 ms = 2.4 servers busy; at most half busy: 4.8.
    assert prefill.basis["tokens_per_s"] == pytest.approx(4000, rel=1e-3)
    assert prefill.demand == pytest.approx(4.8, rel=1e-3)
    assert (prefill.current, prefill.recommended) == (2, 5)


def test_a_prefill_whose_computed_tokens_are_unknown_counts_its_whole_prompt() -> None:
    sizer = Sizer(SizingConfig())
    sizer.answered(prefilled(None, prompt_tokens=700))
    sizer.answered(AccessRecord(request_id="r"))
    assert (sizer._tokens, sizer._prefills) == (700, 1)


def test_decode_servers_are_the_running_requests_over_what_one_runs_within_the_gap() -> None:
    clock = Clock()
    sizer = Sizer(SizingConfig(decode_itl_ms=50), clock)
    # The gap line before anything is measured: 20 ms with one running, 1 ms more each.
    timings = Timings(ObjectivesConfig(itl_ms=20, itl_ms_per_running=1))
    decode = ["http://decode-0:8000", "http://decode-1:8000"]
    for second in range(0, 600, 2):
        clock.now = second
        sizer.read_servers(prefill=[], decode=decode, outstanding={decode[0]: 40, decode[1]: 30})
    [pool] = sizer.sizes(timings, tilert=False)
    # 19 ms + 1 ms x running <= 50 ms: 31 running a server; 70 running need 3.
    assert pool.basis["running_per_server"] == 31
    assert pool.demand == pytest.approx(70 / 31, rel=1e-3)
    assert (pool.current, pool.recommended) == (2, 3)


def test_a_measured_gap_line_moves_the_decode_recommendation() -> None:
    clock = Clock()
    sizer = Sizer(SizingConfig(decode_itl_ms=50), clock)
    timings = Timings(ObjectivesConfig(itl_ms=20, itl_ms_per_running=1))
    url = "http://decode-0:8000"
    for running in range(1, 60):  # the server measured slower: 10 ms + 4 ms a request
        timings.learn_gap(url, running, 0.010 + 0.004 * running)
    sizer.read_servers(prefill=[], decode=[url], outstanding={url: 30})
    [pool] = sizer.sizes(timings, tilert=False)
    assert pool.basis["running_per_server"] == 10
    assert pool.recommended == 3


def test_a_decode_server_slower_than_the_target_alone_runs_one_request() -> None:
    sizer = Sizer(SizingConfig(decode_itl_ms=10))
    timings = Timings(ObjectivesConfig(itl_ms=20, itl_ms_per_running=1))
    sizer.read_servers(prefill=[], decode=["http://d:8000"], outstanding={"http://d:8000": 5})
    [pool] = sizer.sizes(timings, tilert=False)
    assert (pool.basis["running_per_server"], pool.recommended) == (1, 5)


def test_a_reload_keeps_the_figures_followed_and_takes_the_new_targets() -> None:
    clock = Clock()
    old = Sizer(SizingConfig(tilert_wait_share=0.5), clock)
    old.read_pool(snapshot(nodes=8, busy=6, waiting=0, hold_s=2.0))
    new = Sizer(SizingConfig(tilert_wait_share=0.01), clock)
    new.adopt(old)
    timings = Timings(ObjectivesConfig())
    [before] = old.sizes(timings, tilert=True)
    [after] = new.sizes(timings, tilert=True)
    assert after.demand == before.demand == 6.0
    assert after.recommended > before.recommended


def test_a_pool_whose_state_cannot_be_read_keeps_its_figures() -> None:
    """Redis unreachable: the snapshot shows every node out and none held, which is no
    reading of the load (an outage is not an idle pool)."""
    clock = Clock()
    sizer = Sizer(SizingConfig(), clock)
    sizer.read_pool(snapshot(nodes=4, busy=3, waiting=2, hold_s=2.0))
    unreadable = GateSnapshot(
        4,
        dict.fromkeys(["n0", "n1", "n2", "n3"]),
        dict.fromkeys(["n0", "n1", "n2", "n3"], "gate_unavailable"),
        0,
        retry_after_s=1,
    )
    for second in range(1, 600):
        clock.now = second
        sizer.read_pool(unreadable)
    [tilert] = sizer.sizes(Timings(ObjectivesConfig()), tilert=True)
    assert (tilert.current, tilert.demand) == (4, 5.0)
