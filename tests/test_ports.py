"""The ports handed to servers that bind late: below the kernel's ephemeral range, in the
worker's own block, never twice, never one already bound."""

from __future__ import annotations

import socket

import pytest

from tests.support import ports


def test_a_port_is_below_the_ephemeral_range_in_the_workers_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    port = ports.unclaimed_port()
    assert port in range(ports.FIRST + ports.BLOCK, ports.FIRST + 2 * ports.BLOCK)
    assert port < ports.ephemeral_floor()


def test_no_port_is_given_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_given", set())
    monkeypatch.setattr(ports, "worker_block", lambda: range(20_000, 20_005))
    given = {ports.unclaimed_port() for _ in range(5)}
    assert given == set(range(20_000, 20_005))
    with pytest.raises(RuntimeError, match="every port"):
        ports.unclaimed_port()


def test_a_bound_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        free = next(p for p in range(taken + 1, taken + 100) if ports.bindable(p))
        monkeypatch.setattr(ports, "_given", set())
        block = range(taken, free + 1)  # the ports between are bound by others too
        monkeypatch.setattr(ports, "worker_block", lambda: block)
        assert ports.unclaimed_port() == free
        with pytest.raises(RuntimeError, match="every port"):
            ports.unclaimed_port()


def test_a_worker_whose_block_would_reach_the_ephemeral_range_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw99")
    with pytest.raises(RuntimeError, match="ephemeral range"):
        ports.worker_block()
